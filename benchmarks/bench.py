"""Speed benchmark: `python benchmarks/bench.py [options]` is `shardbench bench [options]`.

See `shardbench bench --help` and the README's performance section.
"""

import sys

from shardbench.cli import main

if __name__ == "__main__":
    sys.argv.insert(1, "bench")
    sys.exit(main())
