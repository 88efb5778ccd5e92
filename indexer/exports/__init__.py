"""Writers of this engine's index into other engines' formats, one module per engine.

``lucene``: a Pyserini impact index (JsonVectorCollection -> Lucene), ``lucene_jvm``: the JVM
set-up Pyserini needs, ``milvus``: a Milvus collection (Milvus Lite file or server). They live
in indexer/ because ``build-index`` runs them; the matching readers are retriever/backends/.
"""
