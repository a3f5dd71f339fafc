"""The process: the command line (`cli`), the app and its long-lived objects (`app`,
`serving`), the worker processes (`workers`), the serving loop they share (`serve`), reload on
SIGHUP (`reload`) and idle connection closing (`idle_close`)."""

# Every process this package starts (the console script, the app, each worker) migrates the
# database with every table's migrations: a feature registers its own tables' steps when it
# is imported (proxy.storage.migrations, `Owned`), and the audit rollups are one such feature.
from proxy.audit import rollup as _registers_rollup_tables  # noqa: F401
