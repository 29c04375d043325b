"""Token-In Token-Out (TITO): what a per-session token buffer needs from chat templates and tokenizers."""
