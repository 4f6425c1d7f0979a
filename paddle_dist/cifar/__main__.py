"""`python -m paddle_dist.cifar fake DIR ...` (see fake.py)."""

import sys

from .fake import main

sys.exit(main())
