"""``python -m cartonstore.cli``: the same command as the installed ``cartonstore``."""

import sys

from cartonstore.cli.commands import main

sys.exit(main())
