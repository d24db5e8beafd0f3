"""corral's loop under blocking calls: who runs it, timeouts, threads, Ctrl-C, background work."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading

import pytest
from tests.support.cli import foreground_sigint

from corral import blocking
from corral.blocking import run_blocking
from corral.errors import RequestTimeout


async def _answer(value: int, delay: float = 0.0) -> int:
    await asyncio.sleep(delay)
    return value


async def _fail() -> None:
    raise ValueError("inside")


TASKLESS = pytest.mark.parametrize("taskless", [False, True], ids=["task", "taskless"])


@TASKLESS
def test_results_errors_and_timeouts(taskless: bool):
    assert run_blocking(_answer(7), 10, taskless=taskless) == 7
    assert run_blocking(_answer(8, 0.01), 10, taskless=taskless) == 8
    with pytest.raises(ValueError, match="inside"):
        run_blocking(_fail(), None, taskless=taskless)
    cancelled = threading.Event()

    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(RequestTimeout) as err:
        run_blocking(slow(), 0.05, taskless=taskless)
    assert err.value.details == {"timeout_s": 0.05}
    assert cancelled.is_set()  # the call was cancelled, not left running

    async def raises_its_own_timeout() -> None:
        raise TimeoutError("mine")

    with pytest.raises(TimeoutError, match="mine") as own:
        run_blocking(raises_its_own_timeout(), 10, taskless=taskless)
    assert not isinstance(own.value, RequestTimeout)


@TASKLESS
def test_one_alarm_serves_calls_of_any_timeout(taskless: bool):
    # The keeper leaves its one timer armed after a call: a later call with a further
    # deadline must not time out when it rings, and one with a nearer deadline moves it.
    assert run_blocking(_answer(1), 0.2, taskless=taskless) == 1
    assert run_blocking(_answer(2, 0.5), 30, taskless=taskless) == 2
    with pytest.raises(RequestTimeout):
        run_blocking(_answer(3, 30), 0.2, taskless=taskless)


def test_a_taskless_call_runs_as_a_task_would():
    async def inside() -> tuple[str, object]:
        await asyncio.sleep(0)  # a bare yield: the loop runs a turn
        ready = asyncio.get_running_loop().create_future()
        ready.set_result(None)
        await ready  # done already: no wait
        children = await asyncio.gather(_answer(1, 0.01), _answer(2))
        return threading.current_thread().name, (asyncio.current_task(), children)

    run_blocking(_answer(0), 10)  # (this thread runs the loop from now on)
    name, (task, children) = run_blocking(inside(), 10, taskless=True)
    assert (name, task, children) == (threading.current_thread().name, None, [1, 2])

    stopped: list[str] = []

    async def child(k: int) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stopped.append(f"child {k}")
            raise

    async def parent() -> None:
        try:
            await asyncio.gather(child(1), child(2))
        except asyncio.CancelledError:
            stopped.append("parent")
            raise

    # A timeout cancels what the coroutine waits for, as a task's cancellation does:
    # the gather's children first, then the coroutine itself, none left running.
    with pytest.raises(RequestTimeout):
        run_blocking(parent(), 0.1, taskless=True)
    assert stopped == ["child 1", "child 2", "parent"]


def test_a_caller_runs_the_loop_itself():
    async def where() -> str:
        return threading.current_thread().name

    run_blocking(_answer(0), 10)
    assert run_blocking(where(), 10) == threading.current_thread().name


def test_calls_from_inside_a_running_loop_and_from_the_loop_itself():
    async def cell() -> int:  # a notebook cell: the caller has a loop of its own
        return run_blocking(_answer(3, 0.01), 10)

    assert asyncio.run(cell()) == 3

    async def nested() -> None:
        run_blocking(_answer(1), 10)

    with pytest.raises(RuntimeError, match="corral's own event loop"):
        run_blocking(nested(), 10)


def test_many_threads_at_once():
    results: dict[int, list[int]] = {}

    def worker(k: int) -> None:
        results[k] = [run_blocking(_answer(k * 100 + i, 0.001 * (i % 3)), 30) for i in range(50)]

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == {k: [k * 100 + i for i in range(50)] for k in range(8)}


def test_a_call_handed_over_finishes_when_the_driver_is_done():
    started = threading.Event()
    done: list[int] = []

    async def long_call() -> int:
        started.set()
        await asyncio.sleep(0.2)
        return 1

    driver = threading.Thread(target=lambda: done.append(run_blocking(long_call(), 30)))
    driver.start()
    started.wait(10)
    # This call is handed to the loop the driver runs; it outlives the driver's call.
    assert run_blocking(_answer(2, 0.5), 30) == 2
    driver.join(30)
    assert done == [1]


def test_background_work_goes_on_between_calls():
    fired = threading.Event()

    async def schedule() -> None:
        asyncio.get_running_loop().call_later(0.05, fired.set)

    run_blocking(schedule(), 10)
    # Nobody calls again: the background thread takes the loop after the grace period.
    assert fired.wait(blocking.GRACE_S + 30)


def test_taskless_calls_on_a_worker_threads_loop():
    # The first call from a worker thread gives the keeper the runtime's loop (uvloop
    # when installed), whose run_forever the taskless driver runs as it runs asyncio's.
    out = _run_child(
        """
        import asyncio, threading
        from corral.blocking import run_blocking
        from corral.errors import RequestTimeout

        async def answer(value, delay=0.0):
            await asyncio.sleep(delay)
            return value

        async def both():
            return await asyncio.gather(answer(1, 0.01), answer(2))

        def worker():
            first = run_blocking(answer(1), 10, taskless=True)
            print(first, run_blocking(both(), 10, taskless=True))
            try:
                run_blocking(answer(3, 30), 0.1, taskless=True)
            except RequestTimeout:
                print("timed out")
            print(run_blocking(answer(4, 0.2), 30, taskless=True))

        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        """
    )
    assert out[:3] == ["1 [1, 2]", "timed out", "4"]


@TASKLESS
def test_ctrl_c_cancels_the_call_and_the_loop_lives_on(taskless: bool):
    out = _run_child(
        """
        import asyncio, os, signal, sys, threading
        from corral.blocking import run_blocking

        taskless = sys.argv[1] == "True"

        cancelled = []

        async def long_call():
            loop = asyncio.get_running_loop()
            loop.call_later(0.2, os.kill, os.getpid(), signal.SIGINT)
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.append(True)
                raise

        try:
            run_blocking(long_call(), None, taskless=taskless)
        except KeyboardInterrupt:
            print("interrupted", cancelled)

        async def answer():
            return 42

        print("after", run_blocking(answer(), 10, taskless=taskless))
        print("handler", signal.getsignal(signal.SIGINT) is signal.default_int_handler)
        """,
        str(taskless),
    )
    assert out[:3] == ["interrupted [True]", "after 42", "handler True"]


@TASKLESS
def test_ctrl_c_before_the_calls_first_step_interrupts_it(taskless: bool):
    # A stepping loop's Ctrl-C often lands between two calls' coroutines: here a callback
    # the first call leaves on the loop sends it, on asyncio's loop before the second
    # call's task has run a step, so that task is cancelled before its coroutine starts
    # (and never stops the loop from inside); a taskless call is stepped first and
    # interrupted in its first wait. One of the calls must raise
    # KeyboardInterrupt: not return as if nothing happened, nor wait for its timeout.
    out = _run_child(
        """
        import asyncio, os, signal, sys
        from corral.blocking import run_blocking

        taskless = sys.argv[1] == "True"

        async def arm():
            asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGINT)

        async def answer():
            if taskless:  # a taskless call that never waits does not run the loop
                await asyncio.sleep(0.01)
            return 42

        try:
            run_blocking(arm(), 10, taskless=taskless)  # (a loop may run the kill before it stops)
            print("returned", run_blocking(answer(), 600, taskless=taskless))
        except KeyboardInterrupt:
            print("interrupted")
        print("after", run_blocking(answer(), 10, taskless=taskless))
        """,
        str(taskless),
    )
    assert out[:2] == ["interrupted", "after 42"]


@pytest.mark.parametrize("first", ["main", "worker"])
def test_the_loop_suits_the_thread_of_the_first_call(first):
    # uvloop run in the main thread sets up signal handling on every run, i.e. every
    # call: the main thread gets asyncio's own loop; other threads the runtime's.
    out = _run_child(
        """
        import asyncio, sys, threading
        from corral import runtime
        from corral.blocking import background_loop

        loops = []
        if sys.argv[1] == "main":
            loops.append(background_loop())
        else:
            worker = threading.Thread(target=lambda: loops.append(background_loop()))
            worker.start()
            worker.join()
        print(type(loops[0]) is type(asyncio.new_event_loop()))
        print(type(loops[0]) is type(runtime.loop_factory()()))
        """,
        first,
    )
    assert out[0 if first == "main" else 1] == "True"


def _run_child(script: str, *args: str) -> list[str]:
    """The stdout lines of ``script`` (dedented) run by a fresh Python with ``args``."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        preexec_fn=foreground_sigint,  # Ctrl-C works even if the suite ignores it
    ).stdout.split("\n")
