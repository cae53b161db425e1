-- pgdq 1.0.0 -> 1.1.0, for ALTER EXTENSION pgdq UPDATE and `pgdq upgrade`.
-- What the step changes besides the functions; python/tools/gen_upgrade.py
-- puts every function of sql/src where the @functions line is. What it
-- changes is in CHANGELOG.md; tests/test_upgrade.py checks that 1.0.0 plus
-- the step equals a fresh 1.1.0 install, object for object.

-- Functions whose arguments changed (CREATE OR REPLACE cannot change them).
DROP FUNCTION dq__check_lease(interval);
DROP FUNCTION dq__cron_delete(text, text, text, boolean);
DROP FUNCTION dq__bury(bigint[], text, timestamptz);
-- No polymorphic helpers: an exact-type overload planted in pgdq's schema
-- would be called instead (docs/security.md).
DROP FUNCTION dq__not_null(anyelement, text);
DROP FUNCTION dq__check_elements(anyarray, text);
-- dq_schedules shows a schedule's last error (1.1): new columns, a new result.
ALTER TABLE @extschema@.dq_schedules
    ADD COLUMN last_error text,
    ADD COLUMN last_error_at timestamptz,
    ADD COLUMN failures integer NOT NULL DEFAULT 0,
    ADD COLUMN missed_from timestamptz;
DROP FUNCTION dq_schedules(text);
-- A message keeps the error of its last nack (1.1): a new column (instant,
-- no rewrite), dq_nack's new 4th argument `error`, and a bury that says it.
ALTER TABLE @extschema@.dq_messages ADD COLUMN last_error text;
DROP FUNCTION dq_nack(uuid, timestamptz, jsonb);
-- Snapshot reads of every queue's dead letters by id range (dq_read_*).
CREATE INDEX dq_dead_letters_id ON @extschema@.dq_dead_letters (id);
-- Parameters carry their API names, no p_ prefix (sql/src/20_checks.sql).
DROP FUNCTION dq__materialise(text, timestamptz);
-- The reading functions check their arguments themselves (LANGUAGE sql).
DROP FUNCTION dq__get(text, text);
DROP FUNCTION dq__stats(text);
DROP FUNCTION dq__dead_list(text, integer);
-- The poll index's entries are unique: deduplication only cost time (1.1).
ALTER INDEX @extschema@.dq_messages_due SET (deduplicate_items = off);

-- @functions

-- A 1.0.0 extension install restored from a dump restarted its ids at 1 (the
-- sequence was not dumped) and then failed every offer with a duplicate id:
-- move the sequence past the ids in use. (The schema is current_schema():
-- never spliced into a string.)
SELECT pg_catalog.setval(
    pg_catalog.format('%I.dq_messages_id_seq', pg_catalog.current_schema())::pg_catalog.regclass,
    m.max_id
)
FROM (SELECT pg_catalog.max(d.id) AS max_id FROM @extschema@.dq_messages AS d) AS m
WHERE m.max_id OPERATOR(pg_catalog.>) (SELECT s.last_value FROM @extschema@.dq_messages_id_seq AS s);

-- Extension installs: pg_dump keeps the id sequence's position too, so ids
-- handed out before a dump and restore are never handed out again.
DO $extension_only$
BEGIN
    IF EXISTS (
        SELECT FROM pg_catalog.pg_extension AS e
        INNER JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
        WHERE e.extname OPERATOR(pg_catalog.=) 'pgdq'
            AND n.nspname OPERATOR(pg_catalog.=) pg_catalog.current_schema()
    ) THEN
        PERFORM pg_catalog.pg_extension_config_dump(
            pg_catalog.format('%I.dq_messages_id_seq', pg_catalog.current_schema())::pg_catalog.regclass, ''
        );
    END IF;
END
$extension_only$;

-- Warn when every role may create objects in pgdq's schema (docs/security.md).
SELECT @extschema@.dq__warn_if_open_schema(pg_catalog.current_schema());
