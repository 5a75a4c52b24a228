"""What may go and removing it: the pure plan (plan.py), applied under
the store lock in short turns (collect.py); holds that keep a carton while a
process completes it (holds.py); what these and verification are handed
of the store (parts.py, a protocol ``Store`` meets). Imports store/root/,
content/, metadata/, materialize/.
"""
