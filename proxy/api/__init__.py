"""The management API, /api/v1: JSON, seed 004's shapes and statuses to the letter.

`routes` is the route table; each route is served through `endpoint.view`, which fetches the
`Api` (`context`), authenticates the `Caller` (`caller`) and hands both to a module-level
handler in `servers`, `keys`, `users`, `roles` or `audit`. `bodies` and `query` parse what comes
in; `models` are the shapes (a server's in `proxy.strict`), `openapi` documents them. A handler
raises one of `proxy.errors`' classes, which the app's one error handler renders. The live
server table the handlers change is `proxy.servers`, shared with the MCP edge."""
