"""Cartons as OCI artifacts: pushed to and added from any OCI registry.

reference.py and artifact.py are pure (names and manifests); challenge.py
and credentials.py read auth challenges and docker's credentials; auth.py
answers challenges; registry.py speaks the distribution API; pull.py and
push.py move cartons between a registry and the store.
"""
