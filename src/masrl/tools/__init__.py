"""Tools that workflows act on (the seam: ``base``), the code verifier over the sandbox (``masrl.sandbox``), a retrieval
service and client, the calculator and search tools."""
