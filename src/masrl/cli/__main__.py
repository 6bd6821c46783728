import sys

from masrl.cli.main import main

sys.exit(main())
