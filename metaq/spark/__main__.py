"""``python -m metaq.spark`` is ``metaq-spark-report``."""

import sys

from metaq.spark.report import main

if __name__ == "__main__":
    sys.exit(main())
