"""SavedModel export, prediction and the event-file report."""
