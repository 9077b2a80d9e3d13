"""The simulated hosts, kept importable as ``bench.simhosts``.

They live in the top-level :mod:`simhosts` package, which both ``bench/`` and
``tests/`` import; ``python -m bench.simhosts`` still runs the server.
"""

from simhosts import *  # noqa: F403
from simhosts import __all__  # noqa: F401
from simhosts.server import main

if __name__ == "__main__":
    main()
