"""Scrapy commands of this plugin (``COMMANDS_MODULE``-style package).

The ``throttling`` command is also registered through the ``scrapy.commands``
entry point, so ``scrapy throttling`` works once the package is installed.
"""
