"""``serve INDEX``: one warm Retriever behind HTTP (FastAPI), with a search page at ``/``.

- :mod:`retriever.server.config`: the server's limits and access settings;
- :mod:`retriever.server.documents`: titles and snippets, read from the index's corpus;
- :mod:`retriever.server.app`: the routes, mapping the search contract to HTTP;
- :mod:`retriever.server.cli`: the ``serve`` command (uvicorn).
"""
