"""The process: the command line (`cli`), the app and its long-lived objects (`app`,
`serving`), the worker processes (`workers`), the serving loop they share (`serve`), reload on
SIGHUP (`reload`) and idle connection closing (`idle_close`)."""
