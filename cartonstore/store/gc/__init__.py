"""What may go and removing it: the pure plan (plan.py), applied under
the store lock in short turns (collect.py); holds that keep a carton while a
process completes it (holds.py); the parts every store operation works on
(parts.py). Imports store/root/, content/, metadata/, materialize/.
"""
