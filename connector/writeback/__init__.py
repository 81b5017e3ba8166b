"""Stage 3, the owner reaches the CRM: dispatchers claim outbox rows and write owners back,
batched by parent account, without overwriting an owner a person set.
"""
