"""Stage 2, a lead gets an owner: rules pick the team, the rotation picks the rep, and the
assignment, the member's count and the outbox row are recorded in one transaction.
"""
