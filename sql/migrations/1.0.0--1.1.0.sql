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
-- Channels and priority (1.1). A message's channel ('' for none) and
-- priority: new columns with defaults, added without a rewrite.
ALTER TABLE @extschema@.dq_messages
    ADD COLUMN channel text COLLATE "C" NOT NULL DEFAULT '',
    ADD COLUMN priority integer NOT NULL DEFAULT 0;
-- The poll index keeps the plain messages (every message of a 1.0.0 queue),
-- with its entries unique (deduplication only cost time); the others get
-- their own. Rebuilding it reads the table once.
DROP INDEX @extschema@.dq_messages_due;
CREATE INDEX dq_messages_due ON @extschema@.dq_messages (queue, due_at, id)
WITH (deduplicate_items = off)
WHERE channel = '' AND priority = 0;
CREATE INDEX dq_messages_grouped ON @extschema@.dq_messages (queue, channel, priority DESC, due_at, id)
WITH (deduplicate_items = off)
WHERE channel <> '' OR priority <> 0;
CREATE INDEX dq_messages_leases ON @extschema@.dq_messages (queue, channel, due_at)
WHERE lock_token IS NOT NULL AND channel <> '';
-- A redriven dead letter goes back to its channel and priority.
ALTER TABLE @extschema@.dq_dead_letters
    ADD COLUMN channel text COLLATE "C" NOT NULL DEFAULT '',
    ADD COLUMN priority integer NOT NULL DEFAULT 0;
-- The groups and their turn order (sql/src/10_storage.sql).
CREATE TABLE @extschema@.dq_groups (
    queue text COLLATE "C" NOT NULL,
    channel text COLLATE "C" NOT NULL,
    max_concurrency integer CONSTRAINT dq_groups_max_concurrency CHECK (max_concurrency >= 1),
    min_interval interval CONSTRAINT dq_groups_min_interval CHECK (min_interval > '0'),
    turn bigint,
    last_leased_at timestamptz,
    first_due timestamptz NOT NULL,
    wake_at timestamptz,
    CONSTRAINT dq_groups_pkey PRIMARY KEY (queue, channel)
);
CREATE INDEX dq_groups_turns ON @extschema@.dq_groups (queue, turn NULLS FIRST, first_due, channel)
WHERE wake_at IS NULL;
CREATE INDEX dq_groups_wakes ON @extschema@.dq_groups (queue, wake_at)
WHERE wake_at IS NOT NULL;
CREATE SEQUENCE @extschema@.dq_turns AS bigint;
COMMENT ON TABLE @extschema@.dq_groups IS
'pgdq channels and turn order. Use the dq_channel* functions; the layout is internal and may change.';
-- Every role that could use pgdq 1.0.0 keeps working (every poll reads
-- dq_groups): dq_groups gets the privileges each role, PUBLIC included, has
-- on dq_messages, and the turns sequence goes to each that may update it.
-- Row-level security on dq_messages carries over too: its policies are
-- copied to dq_groups, whose queue column they can read as they read
-- dq_messages' (docs/security.md). Names come from the catalogs, quoted.
DO $carry_over$
DECLARE
    v_schema text := pg_catalog.current_schema();
    v_messages pg_catalog.regclass := pg_catalog.format('%I.dq_messages', pg_catalog.current_schema());
    v_grant record;
    v_policy record;
BEGIN
    FOR v_grant IN
        SELECT
            CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC' ELSE a.grantee::pg_catalog.regrole::text END
                AS grantee,
            a.privilege_type
        FROM pg_catalog.pg_class AS c
        CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
        WHERE c.oid OPERATOR(pg_catalog.=) v_messages
            AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
            AND a.privilege_type OPERATOR(pg_catalog.=) ANY(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE'])
    LOOP
        EXECUTE pg_catalog.format('GRANT %s ON %I.dq_groups TO %s', v_grant.privilege_type, v_schema, v_grant.grantee);
        IF v_grant.privilege_type OPERATOR(pg_catalog.=) 'UPDATE' THEN
            EXECUTE pg_catalog.format('GRANT SELECT, USAGE ON SEQUENCE %I.dq_turns TO %s', v_schema, v_grant.grantee);
        END IF;
    END LOOP;
    IF (SELECT c.relrowsecurity FROM pg_catalog.pg_class AS c WHERE c.oid OPERATOR(pg_catalog.=) v_messages) THEN
        EXECUTE pg_catalog.format('ALTER TABLE %I.dq_groups ENABLE ROW LEVEL SECURITY', v_schema);
        FOR v_policy IN
            SELECT
                p.polname,
                CASE WHEN p.polpermissive THEN 'PERMISSIVE' ELSE 'RESTRICTIVE' END AS kind,
                CASE p.polcmd
                    WHEN 'r' THEN 'SELECT' WHEN 'a' THEN 'INSERT' WHEN 'w' THEN 'UPDATE' WHEN 'd' THEN 'DELETE'
                    ELSE 'ALL'
                END AS command,
                (
                    SELECT pg_catalog.string_agg(
                        CASE WHEN r.oid OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC' ELSE r.oid::pg_catalog.regrole::text END,
                        ', '
                    )
                    FROM pg_catalog.unnest(p.polroles) AS r (oid)
                ) AS roles,
                ' USING (' OPERATOR(pg_catalog.||) pg_catalog.pg_get_expr(p.polqual, p.polrelid)
                    OPERATOR(pg_catalog.||) ')' AS using_clause,
                ' WITH CHECK (' OPERATOR(pg_catalog.||) pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid)
                    OPERATOR(pg_catalog.||) ')' AS check_clause
            FROM pg_catalog.pg_policy AS p
            WHERE p.polrelid OPERATOR(pg_catalog.=) v_messages
        LOOP
            EXECUTE pg_catalog.format(
                'CREATE POLICY %I ON %I.dq_groups AS %s FOR %s TO %s%s%s',
                v_policy.polname, v_schema, v_policy.kind, v_policy.command, v_policy.roles,
                coalesce(v_policy.using_clause, ''), coalesce(v_policy.check_clause, '')
            );
        END LOOP;
    END IF;
END
$carry_over$;
-- A delivery and dq_get's rows say the message's channel and priority;
-- dq_offer and dq_offer_many take them (new arguments, new signatures).
ALTER TYPE @extschema@.dq_delivery ADD ATTRIBUTE channel text, ADD ATTRIBUTE priority integer;
DROP FUNCTION dq_get(text, text);
DROP FUNCTION dq_offer(text, text, jsonb, timestamptz, boolean);
DROP FUNCTION dq_offer_many(text, text[], jsonb[], timestamptz[], boolean);
DROP FUNCTION dq__same_offer(jsonb, timestamptz, jsonb, timestamptz);
DROP FUNCTION dq__offer_chain(text[], jsonb[], timestamptz[], boolean, timestamptz, text[], jsonb[], timestamptz[]);
DROP FUNCTION dq__check_offer_arrays(text[], jsonb[], timestamptz[]);

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
        PERFORM pg_catalog.pg_extension_config_dump(
            pg_catalog.format('%I.dq_groups', pg_catalog.current_schema())::pg_catalog.regclass, ''
        );
        PERFORM pg_catalog.pg_extension_config_dump(
            pg_catalog.format('%I.dq_turns', pg_catalog.current_schema())::pg_catalog.regclass, ''
        );
    END IF;
END
$extension_only$;

-- Warn when every role may create objects in pgdq's schema (docs/security.md).
SELECT @extschema@.dq__warn_if_open_schema(pg_catalog.current_schema());
