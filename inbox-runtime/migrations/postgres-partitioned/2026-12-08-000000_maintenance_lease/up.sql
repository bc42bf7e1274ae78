-- Who runs the generation layout's maintenance, and until when: a lease, one
-- row at most. A run takes it in one statement (when there is none or it
-- expired), renews it as it goes and deletes it at its end; a run that died
-- leaves it to expire. It replaces a session advisory lock, which a
-- transaction pooler (PgBouncer) voids: consecutive statements of one client
-- reach different server sessions, so the unlock could miss the session
-- holding the lock, and a lock left on a pooled session blocked every later
-- run.
CREATE TABLE IF NOT EXISTS inbox_maintenance_lease (
    singleton BOOLEAN PRIMARY KEY DEFAULT TRUE CONSTRAINT inbox_maintenance_lease_one CHECK (singleton),
    holder TEXT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
