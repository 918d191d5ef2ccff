"""``python -m conductor_pipeline.gpu_check`` (``make gpu-check``)."""

import sys

from conductor_pipeline.gpu_check.runner import main

sys.exit(main())
