-- Audit retention (SKIPLOCK_RETAIN_AUDIT_SECONDS) deletes the oldest rows in batches: this index
-- finds them without reading the rows that stay, however long the log has grown.
CREATE INDEX IF NOT EXISTS audit_log_at ON skiplock.audit_log (at);
