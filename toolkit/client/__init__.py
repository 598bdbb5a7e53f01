"""Clients for a served repository: gRPC streaming and HTTP generate against the ensemble's text API."""
