import sys

from raygate.cli import main

sys.exit(main())
