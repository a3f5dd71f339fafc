"""People: the humans who sign in here (apart from callers' identity, proxy/auth/).

    accounts  users, roles and passwords in the database
    signin    the sign-in pages and browser sessions (Web), the pages' shared helpers
    oidc      sign-in through an OpenID Connect provider
    live      a gateway-issued token acting as its user is now (roles, deletion)
"""
