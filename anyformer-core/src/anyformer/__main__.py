"""``python -m anyformer``: the same as the ``anyformer`` command."""

import sys

from anyformer.cli._main import main

sys.exit(main())
