import sys

from specc.cli import main

sys.exit(main())
