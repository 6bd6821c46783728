"""Tools that workflows act on: a code sandbox and verifier, a retrieval service and client."""
