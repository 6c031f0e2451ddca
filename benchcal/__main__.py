import sys

from benchcal.cli import main

sys.exit(main())
