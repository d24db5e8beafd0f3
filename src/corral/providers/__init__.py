"""Where a server runs: local process, Docker, Hugging Face Spaces; and the manifest."""
