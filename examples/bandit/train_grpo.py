"""Train a language model with TRL's GRPOTrainer against a served corral environment.

    python examples/bandit/train_grpo.py --steps 60 --out runs/grpo-bandit

Everything is local and runs on a CPU in a few minutes: the model is a tiny Llama built
from a config (random weights), its tokenizer is made here from a small vocabulary, and
nothing is downloaded. The environment, ``examples/bandit`` (ten levers, three pulls an
episode, lever 7 pays), runs in its own ``corral serve`` process, started by
:func:`corral.adapters.trl.environment_factory`; TRL calls its ``pull`` tool once per
turn, for as many turns as the model keeps calling it, and the reward is the episode's
return. The run writes ``rewards.json`` (the mean reward of each step, the figures) and
``rewards.png`` (reward per step, drawn with Pillow; no matplotlib needed) to ``--out``.

The vocabulary is the chat template's words, JSON's punctuation, the observation's field
names, digits, and one token per whole tool call (``<tool_call>{"name": "pull",
"arguments": {"lever": 7}}</tool_call>``), the way a real chat model's tokenizer has
``<tool_call>`` as one token: a model with random weights then makes well-formed calls
from the start, and what GRPO has to teach it is which lever pays and to keep pulling
for three turns. The chat template is Qwen3's, as TRL ships it; TRL parses the calls with
its response schema for that template.

To train a real model instead, pass its name to ``AutoModelForCausalLM.from_pretrained``
and its tokenizer, and keep the rest: ``environment_factory`` does not care which.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TOOL = "pull"
"""The action tool's name (the action is ``LeverAction``; ``pull`` reads better)."""
LEVERS = range(10)


def tiny_tokenizer() -> Any:
    """A word-level tokenizer over a small vocabulary, with Qwen3's chat template.

    Words it does not know (the system prompt's prose) are one ``[UNK]`` each; what the
    model must read and write (the template's roles, the observation's JSON, the tool
    calls) is in the vocabulary.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "\n", " ", "system", "user", "assistant", "tool"]
    words += ["{", "}", '"', ":", ",", ".", "payout", "pulls_left", "true", "false"]
    words += [str(d) for d in range(10)]
    vocab = {word: index for index, word in enumerate(words)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    # Each whitespace character, word and punctuation mark is a token; decoding joins them.
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s|\w+|[^\w\s]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    tokenizer.add_special_tokens([AddedToken(s, special=True) for s in specials])
    markup = ["<tool_response>", "</tool_response>", "<think>", "</think>"]
    calls = [
        f'<tool_call>\n{{"name": "{TOOL}", "arguments": {{"lever": {lever}}}}}\n</tool_call>'
        for lever in LEVERS
    ]
    tokenizer.add_tokens([AddedToken(t, normalized=False) for t in markup + calls])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
    )
    import trl

    template = Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja"
    fast.chat_template = template.read_text()
    return fast


def tiny_model(tokenizer: Any, seed: int) -> Any:
    """A two-layer Llama with random weights (about 100 k parameters)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    return LlamaForCausalLM(config)


@dataclass
class Run:
    """What a training run measured."""

    steps: int
    rewards: list[float]
    """The mean episode return of each step's rollouts (0 to 3)."""
    minutes: float
    cpu_minutes: float
    """This process's CPU time (the environment server's is not counted)."""
    load_average: list[float] = field(default_factory=list)
    tool_calls: list[float] = field(default_factory=list)
    """Tool calls per rollout, each step."""

    def mean(self, first: int, last: int) -> float:
        """The mean of ``rewards[first:last]``."""
        window = self.rewards[first:last]
        return sum(window) / len(window)


def train(
    steps: int = 60,
    *,
    out: Path | None = None,
    seed: int = 0,
    target: str = str(HERE),
    generations: int = 8,
) -> Run:
    """Train the tiny model for ``steps`` GRPO steps against ``target`` (served by a
    ``corral serve`` process started here); write the figures and plot to ``out``."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from corral.adapters.trl import environment_factory

    torch.set_num_threads(1)  # a tiny model: more threads only spin on a busy machine
    started, cpu = time.perf_counter(), time.process_time()
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, seed)
    Bandit = environment_factory(target, tool_name=TOOL, seed_column=None)

    def reward(environments: list[Any], **kwargs: Any) -> list[float]:
        return [env.reward for env in environments]

    prompt = [{"role": "user", "content": "Pull levers to win."}]
    dataset = Dataset.from_dict({"prompt": [prompt] * (generations * steps)})
    args = GRPOConfig(
        output_dir=str(out or HERE / "runs"),
        per_device_train_batch_size=generations,
        num_generations=generations,
        max_completion_length=48,
        max_tool_calling_iterations=4,
        max_steps=steps,
        learning_rate=1e-2,
        beta=0.0,
        temperature=1.0,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        dataloader_num_workers=0,
        seed=seed,
        disable_tqdm=True,
    )
    try:
        trainer = GRPOTrainer(
            model=model,
            processing_class=tokenizer,
            reward_funcs=reward,
            train_dataset=dataset,
            environment_factory=Bandit,
            args=args,
        )
        trainer.train()
    finally:
        Bandit._pool.close()  # the sessions and the corral serve process
    logged = [entry for entry in trainer.state.log_history if "reward" in entry]
    run = Run(
        steps=steps,
        rewards=[float(entry["reward"]) for entry in logged],
        minutes=(time.perf_counter() - started) / 60,
        cpu_minutes=(time.process_time() - cpu) / 60,
        load_average=[round(x, 2) for x in os.getloadavg()],
        tool_calls=[float(entry.get("tools/call_frequency", 0.0)) for entry in logged],
    )
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "rewards.json").write_text(json.dumps(asdict(run), indent=2) + "\n")
        plot(run.rewards, out / "rewards.png", title=f"GRPO on the bandit: {steps} steps")
    return run


# -- the plot: a line chart drawn with Pillow ---------------------------------------


def plot(rewards: list[float], path: Path, *, title: str, top: float = 3.0) -> None:
    """Reward per step as a PNG line chart (axes, ticks, the rewards and their running
    mean over 5 steps), drawn with Pillow."""
    from PIL import Image, ImageDraw

    width, height, left, right, upper, lower = 800, 480, 70, 20, 50, 60
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    span_x, span_y = width - left - right, height - upper - lower
    steps = max(len(rewards), 2)

    def point(step: int, value: float) -> tuple[float, float]:
        x = left + span_x * step / (steps - 1)
        y = upper + span_y * (1 - min(max(value, 0.0), top) / top)
        return x, y

    draw.text((left + span_x // 2 - 3 * len(title), 15), title, fill="black")
    draw.line([(left, upper), (left, upper + span_y), (left + span_x, upper + span_y)], "black")
    for tick in range(int(top) + 1):
        _, y = point(0, tick)
        draw.line([(left - 5, y), (left, y)], "black")
        draw.line([(left + 1, y), (left + span_x, y)], (225, 225, 225))
        draw.text((left - 30, y - 6), f"{tick:.1f}", fill="black")
    every = max(1, round(steps / 10))
    for step in range(0, steps, every):
        x, _ = point(step, 0)
        draw.line([(x, upper + span_y), (x, upper + span_y + 5)], "black")
        draw.text((x - 6, upper + span_y + 10), str(step + 1), fill="black")
    draw.text((left + span_x // 2 - 15, height - 25), "step", fill="black")
    draw.text((5, upper - 22), "mean return", fill="black")
    if len(rewards) >= 2:
        draw.line([point(i, r) for i, r in enumerate(rewards)], (120, 160, 220), 1)
        smooth = [
            sum(rewards[max(0, i - 4) : i + 1]) / len(rewards[max(0, i - 4) : i + 1])
            for i in range(len(rewards))
        ]
        draw.line([point(i, r) for i, r in enumerate(smooth)], (200, 40, 40), 3)
        # The legend goes bottom right, where a rising curve is not.
        legend = upper + span_y - 40
        draw.text((width - 230, legend), "blue: each step's rollouts", fill=(90, 130, 200))
        draw.text((width - 230, legend + 15), "red: mean of the last 5 steps", fill=(200, 40, 40))
    image.save(path, format="PNG")


def png_size(path: Path) -> tuple[int, int]:
    """The width and height a PNG file declares (its IHDR chunk), checked by its CRC."""
    data = path.read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError(f"{path} is not a PNG file")
    if zlib.crc32(data[12:29]) != struct.unpack(">I", data[29:33])[0]:
        raise ValueError(f"{path}: the IHDR chunk's CRC does not match")
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def main(argv: list[str] | None = None) -> int:
    """The command line: train, then print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60, help="GRPO steps (default 60)")
    parser.add_argument("--out", type=Path, default=HERE / "runs", help="where to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", default=str(HERE), help="a corral serve target or a URL")
    options = parser.parse_args(argv)
    run = train(options.steps, out=options.out, seed=options.seed, target=options.target)
    window = min(5, len(run.rewards))
    print(
        f"{run.steps} steps in {run.minutes:.1f} min ({run.cpu_minutes:.1f} min of CPU, load "
        f"{run.load_average}): mean reward {run.mean(0, window):.2f} over the first "
        f"{window} steps, {run.mean(-window, len(run.rewards)):.2f} over the last {window}; "
        f"plot in {options.out / 'rewards.png'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
