"""``python -m simhosts --config hosts.json``: run the simulated hosts."""

from simhosts.server import main

main()
