import sys

from keel.cli.main import main

sys.exit(main())
