"""Run the producer CLI as if Pillow and tifffile were not installed: python -m tests.block_images ARGS."""

import sys

sys.modules["PIL"] = None
sys.modules["tifffile"] = None

from ferry.producer.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
