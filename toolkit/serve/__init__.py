"""The server layer: find tritonserver, launch it on a repository, wait until every model is ready."""
