-- pgdq 1.1.0 -> 1.2.0, for ALTER EXTENSION pgdq UPDATE and `pgdq upgrade`.
-- What the step changes besides the functions; python/tools/gen_upgrade.py
-- puts every function of sql/src where the @functions line is. What it
-- changes is in CHANGELOG.md; tests/test_upgrade.py checks that 1.1.0 plus
-- the step equals a fresh 1.2.0 install, object for object.

-- Functions whose arguments changed (CREATE OR REPLACE cannot change them).
-- Tokens in their queue (1.2): the lock-token functions take a last
-- argument `queue text DEFAULT NULL`; a token of another queue is stale.
DROP FUNCTION dq_ack(uuid);
DROP FUNCTION dq_ack_many(uuid[]);
DROP FUNCTION dq_nack(uuid, timestamptz, jsonb, text);
DROP FUNCTION dq_extend(uuid, interval);
DROP FUNCTION dq_dead_letter(uuid, text);

-- @functions

-- Warn when every role may create objects in pgdq's schema (docs/security.md).
SELECT @extschema@.dq__warn_if_open_schema(pg_catalog.current_schema());
