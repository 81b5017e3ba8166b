"""Stage 1, a lead arrives: receivers (Salesforce Outbound Messages, HubSpot webhooks), the intake
inbox that reads every record back from the CRM, the poller and the file importer.
"""
