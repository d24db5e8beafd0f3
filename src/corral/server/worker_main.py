"""``python -m corral.server.worker_main``: a worker process of ``corral serve --workers``."""

from corral.server.workers import main

if __name__ == "__main__":
    main()
