import sys

from ferry.producer.cli import main

sys.exit(main())
