"""SCIM 2.0 provisioning at /scim/v2 (RFC 7643/7644, docs/provisioning.md): the protocol is
`scim2-server`'s (validation, PATCH, filters' grammar, errors in SCIM's shape) over
`scim2-models`' schemas; `storage` keeps the resources in the database through
`proxy.people.directory`, and `edge` is the ASGI layer in front of Quart that authenticates
the identity provider's client and answers every path under /scim/v2."""
