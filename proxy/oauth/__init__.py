"""Tollhouse as an OAuth 2.1 authorization server for its own endpoints (MCP authorization,
2025-11-25): metadata, authorize with PKCE S256 and consent, token with rotating refresh tokens,
dynamic client registration, Client ID Metadata Documents, revocation."""
