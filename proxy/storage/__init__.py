"""Storage: the database the gateway keeps its tables in (SQLite by default, PostgreSQL when
scaled out), its schema migrations, and the stored-row helpers the tables' owners share.

`db` connects and runs statements off the event loop; `migrations` brings a database to the
schema this version expects (features register the tables they own, as `proxy.audit.rollup`
does for the rollup tables, so storage imports no feature); `stored` holds the small helpers
for rows written through the management API."""
