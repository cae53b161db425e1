-- Install: every api-v1 function (and pgdq's additions) with its exact signature, result shape,
-- defaults, security settings, the dq_delivery and dq_delivery_info types, dq_now and dq_version.
BEGIN;
SELECT plan(147);

-- a composite type's fields, in order, as 'name type'
CREATE FUNCTION pg_temp.fields(composite regclass) RETURNS text[] LANGUAGE sql AS $$
    SELECT array_agg(a.attname::text || ' ' || format_type(a.atttypid, a.atttypmod) ORDER BY a.attnum)
    FROM pg_attribute AS a
    WHERE a.attrelid = composite AND a.attnum > 0 AND NOT a.attisdropped
$$;
SELECT has_type('dq_delivery', 'type dq_delivery exists');
SELECT is(
    pg_temp.fields('dq_delivery'),
    ARRAY[
        'id bigint', 'queue text', 'key text', 'payload jsonb', 'state jsonb',
        'scheduled_at timestamp with time zone', 'created_at timestamp with time zone',
        'attempts integer', 'redelivery boolean', 'lock_token uuid',
        'lease_until timestamp with time zone', 'channel text', 'priority integer', 'headers jsonb'
    ],
    'dq_delivery has exactly the api-v1.2 fields in order'
);
SELECT is(
    pg_temp.fields('dq_delivery_info'),
    ARRAY[
        'id bigint', 'key text', 'channel text', 'priority integer', 'attempts integer',
        'leased_at timestamp with time zone', 'due_at timestamp with time zone', 'last_error text'
    ],
    'dq_delivery_info (dq_deliveries, dq_delivery_of) has the 1.3 fields in order'
);

-- signature, result type and defaults of each public function
CREATE TEMP TABLE ours AS
SELECT
    p.oid,
    p.proname::text AS fn,
    p.prosecdef,
    p.proconfig,
    p.prosrc,
    p.pronamespace::regnamespace::text AS nsp
FROM pg_proc AS p
INNER JOIN pg_type AS t ON p.pronamespace = t.typnamespace
WHERE t.oid = 'dq_delivery'::regtype AND p.proname LIKE 'dq\_%';
CREATE TEMP TABLE expected (fn text, args text, result text);
INSERT INTO expected VALUES
(
    'dq_offer',
    'queue text, key text, payload jsonb, scheduled_at timestamp with time zone DEFAULT NULL::timestamp with time zone, can_update boolean DEFAULT true, channel text DEFAULT NULL::text, priority integer DEFAULT 0, headers jsonb DEFAULT NULL::jsonb',  -- noqa: LT05
    'text'
),
(
    'dq_offer_many',
    'queue text, keys text[], payloads jsonb[], scheduled_ats timestamp with time zone[] DEFAULT NULL::timestamp with time zone[], can_update boolean DEFAULT true, channels text[] DEFAULT NULL::text[], priorities integer[] DEFAULT NULL::integer[], headers jsonb[] DEFAULT NULL::jsonb[]',  -- noqa: LT05
    'TABLE(key text, outcome text)'
),
('dq_poll', 'queue text, lease interval DEFAULT ''00:05:00''::interval', 'SETOF dq_delivery'),
('dq_poll_many', 'queue text, max_count integer, lease interval DEFAULT ''00:05:00''::interval', 'SETOF dq_delivery'),
-- the lock-token functions' last argument queue (1.2)
('dq_ack', 'lock_token uuid, queue text DEFAULT NULL::text', 'boolean'),
('dq_ack_many', 'lock_tokens uuid[], queue text DEFAULT NULL::text', 'integer'),
(
    'dq_ack_poll',
    'lock_tokens uuid[], queue text, max_count integer, lease interval DEFAULT ''00:05:00''::interval',
    'SETOF dq_delivery'
),
(
    'dq_nack',
    'lock_token uuid, retry_at timestamp with time zone DEFAULT NULL::timestamp with time zone, state jsonb DEFAULT NULL::jsonb, error text DEFAULT NULL::text, queue text DEFAULT NULL::text',  -- noqa: LT05
    'boolean'
),
(
    'dq_extend',
    'lock_token uuid, lease interval, queue text DEFAULT NULL::text',
    'timestamp with time zone'
),
('dq_cancel', 'queue text, key text', 'boolean'),
(
    'dq_get',
    'queue text, key text',
    'TABLE(queue text, key text, payload jsonb, state jsonb, scheduled_at timestamp with time zone, due_at timestamp with time zone, attempts integer, leased boolean, created_at timestamp with time zone, channel text, priority integer, headers jsonb)'  -- noqa: LT05
),
('dq_purge', 'queue text', 'bigint'),
(
    'dq_stats',
    'queue text DEFAULT NULL::text',
    'TABLE(queue text, ready bigint, delayed bigint, leased bigint, oldest_ready_at timestamp with time zone, next_due_at timestamp with time zone, paused boolean)'  -- noqa: LT05
),
('dq_next_due', 'queue text', 'timestamp with time zone'),
('dq_version', '', 'text'),
('dq_now', '', 'timestamp with time zone'),
(
    'dq_cron_install',
    'queue text, key_prefix text, config_hash text, scheduled_ats timestamp with time zone[], payloads jsonb[], can_update boolean DEFAULT false',  -- noqa: LT05
    'integer'
),
('dq_cron_uninstall', 'queue text, key_prefix text, config_hash text DEFAULT NULL::text', 'integer'),
-- pgdq's additions: dead letters and queue settings
('dq_configure', 'queue text, max_attempts integer', 'void'),
(
    'dq_dead_letter',
    'lock_token uuid, error text DEFAULT NULL::text, queue text DEFAULT NULL::text',
    'boolean'
),
(
    'dq_dead_list',
    'queue text, max_count integer DEFAULT 100',
    'TABLE(queue text, key text, payload jsonb, state jsonb, scheduled_at timestamp with time zone, created_at timestamp with time zone, attempts integer, error text, failed_at timestamp with time zone, id bigint)'  -- noqa: LT05
),
(
    'dq_dead_redrive',
    'queue text, key text DEFAULT NULL::text, scheduled_at timestamp with time zone DEFAULT NULL::timestamp with time zone',
    'integer'
),
('dq_dead_purge', 'queue text, key text DEFAULT NULL::text', 'bigint'),
-- browsing and snapshot reads (1.1)
(
    'dq_peek',
    'queue text, which text DEFAULT NULL::text, max_count integer DEFAULT 100',
    'TABLE(key text, payload jsonb, state jsonb, scheduled_at timestamp with time zone, due_at timestamp with time zone, attempts integer, leased boolean, lease_until timestamp with time zone, last_error text, id bigint, headers jsonb)'  -- noqa: LT05
),
(
    'dq_read_messages',
    'queue text, from_id bigint, to_id bigint',
    'TABLE(id bigint, queue text, key text, payload jsonb, state jsonb, scheduled_at timestamp with time zone, due_at timestamp with time zone, created_at timestamp with time zone, attempts integer, leased boolean)'  -- noqa: LT05
),
(
    'dq_read_dead_letters',
    'queue text, from_id bigint, to_id bigint',
    'TABLE(id bigint, queue text, key text, payload jsonb, state jsonb, scheduled_at timestamp with time zone, created_at timestamp with time zone, attempts integer, error text, failed_at timestamp with time zone)'  -- noqa: LT05
),
('dq_read_bounds', 'source text, queue text', 'TABLE(low bigint, high bigint)'),
-- and schedules kept by the database
('dq_cron_next', 'expression text, after timestamp with time zone, timezone text', 'timestamp with time zone'),
(
    'dq_schedule_set',
    'queue text, name text, expression text, timezone text DEFAULT ''UTC''::text, payload jsonb DEFAULT ''{}''::jsonb, max_missed integer DEFAULT 1',  -- noqa: LT05
    'timestamp with time zone'
),
('dq_schedule_remove', 'queue text, name text', 'boolean'),
(
    'dq_channel_set',
    'queue text, channel text, max_concurrency integer DEFAULT NULL::integer, min_interval interval DEFAULT NULL::interval',  -- noqa: LT05
    'void'
),
('dq_channel_remove', 'queue text, channel text', 'boolean'),
(
    'dq_channels',
    'queue text',
    'TABLE(channel text, max_concurrency integer, min_interval interval, ready bigint, delayed bigint, leased bigint, last_leased_at timestamp with time zone)'  -- noqa: LT05
),
(
    'dq_schedules',
    'queue text DEFAULT NULL::text',
    'TABLE(queue text, name text, expression text, timezone text, payload jsonb, max_missed integer, next_at timestamp with time zone, last_error text, last_error_at timestamp with time zone, failures integer)'  -- noqa: LT05
),
-- overviews for dashboards and pgdq serve's POST /command (1.1)
('dq_due_hours', 'queue text, hours integer DEFAULT 24', 'TABLE(hour_start timestamp with time zone, due bigint)'),
('dq_key_queues', 'key text', 'SETOF text'),
(
    'dq_dead_stats',
    'queue text DEFAULT NULL::text',
    'TABLE(queue text, dead bigint, last_failed_at timestamp with time zone)'
),
-- keyless messages (1.2), addressed by id
(
    'dq_send',
    'queue text, payload jsonb, scheduled_at timestamp with time zone DEFAULT NULL::timestamp with time zone, channel text DEFAULT NULL::text, priority integer DEFAULT 0, headers jsonb DEFAULT NULL::jsonb',  -- noqa: LT05
    'bigint'
),
(
    'dq_send_many',
    'queue text, payloads jsonb[], scheduled_ats timestamp with time zone[] DEFAULT NULL::timestamp with time zone[], channels text[] DEFAULT NULL::text[], priorities integer[] DEFAULT NULL::integer[], headers jsonb[] DEFAULT NULL::jsonb[]',  -- noqa: LT05
    'SETOF bigint'
),
(
    'dq_get_id',
    'queue text, id bigint',
    'TABLE(queue text, key text, payload jsonb, state jsonb, scheduled_at timestamp with time zone, due_at timestamp with time zone, attempts integer, leased boolean, created_at timestamp with time zone, channel text, priority integer, headers jsonb)'  -- noqa: LT05
),
('dq_cancel_id', 'queue text, id bigint', 'boolean'),
(
    'dq_dead_redrive_id',
    'queue text, id bigint, scheduled_at timestamp with time zone DEFAULT NULL::timestamp with time zone',
    'bigint'
),
('dq_dead_purge_id', 'queue text, id bigint', 'bigint'),
-- browsing a page at a time, run now (1.2, the dashboard's)
(
    'dq_browse',
    'queue text, which text DEFAULT NULL::text, key_prefix text DEFAULT NULL::text, after_due_at timestamp with time zone DEFAULT NULL::timestamp with time zone, after_id bigint DEFAULT NULL::bigint, max_count integer DEFAULT 100',  -- noqa: LT05
    'TABLE(key text, payload jsonb, state jsonb, scheduled_at timestamp with time zone, due_at timestamp with time zone, attempts integer, leased boolean, lease_until timestamp with time zone, last_error text, id bigint, headers jsonb)'  -- noqa: LT05
),
('dq_run_now', 'queue text, id bigint', 'boolean'),
-- pause and resume, history (1.2)
('dq_pause', 'queue text', 'boolean'),
('dq_resume', 'queue text', 'boolean'),
('dq_retain', 'queue text, keep interval', 'void'),
(
    'dq_history',
    'queue text, key text DEFAULT NULL::text, max_count integer DEFAULT 100',
    'TABLE(queue text, key text, id bigint, outcome text, payload jsonb, state jsonb, channel text, priority integer, created_at timestamp with time zone, scheduled_at timestamp with time zone, last_leased_at timestamp with time zone, finished_at timestamp with time zone, attempts integer, last_error text, headers jsonb)'  -- noqa: LT05
),
(
    'dq_history_stats',
    'queue text, since timestamp with time zone, bucket interval',
    'TABLE(bucket_at timestamp with time zone, acked bigint, dead bigint, cancelled bigint, lateness_p50 interval, lateness_p99 interval, run_p50 interval, run_p99 interval)'  -- noqa: LT05
),
(
    'dq_history_bins',
    'queue text, since timestamp with time zone',
    'TABLE(minute_at timestamp with time zone, measure text, bin smallint, n bigint)'
),
-- every queue's minutes at once (1.3, /metrics)
(
    'dq_history_minutes',
    'since timestamp with time zone, queues text[] DEFAULT NULL::text[]',
    'TABLE(queue text, minute_at timestamp with time zone, acked bigint, dead bigint, cancelled bigint, measure text, bin smallint, n bigint)'  -- noqa: LT05
),
-- a message finished by key or by id, recorded as acked (1.3)
('dq_finish', 'queue text, key text', 'boolean'),
('dq_finish_id', 'queue text, id bigint', 'boolean'),
-- running and retrying messages, releasing a lease, failures over time (1.3, the dashboard's)
-- (their columns: dq_delivery_info, checked below)
('dq_deliveries', 'queue text, which text, max_count integer DEFAULT 100', 'SETOF dq_delivery_info'),
('dq_delivery_of', 'queue text, id bigint', 'SETOF dq_delivery_info'),
('dq_release', 'queue text, id bigint', 'boolean'),
(
    'dq_dead_counts',
    'queue text, since timestamp with time zone, bucket interval',
    'TABLE(queue text, bucket_at timestamp with time zone, dead bigint)'
);

SELECT is(
    (
        SELECT pg_get_function_arguments(o.oid) FROM ours AS o
        WHERE o.fn = e.fn
    ),
    e.args,
    e.fn || ' has the api-v1 arguments and defaults'
) FROM expected AS e
ORDER BY e.fn;

SELECT is(
    (
        SELECT pg_get_function_result(o.oid) FROM ours AS o
        WHERE o.fn = e.fn
    ),
    e.result,
    e.fn || ' returns the api-v1 result shape'
) FROM expected AS e
ORDER BY e.fn;

SELECT is(
    (
        SELECT array_agg(o.fn ORDER BY o.fn) FROM ours AS o
        WHERE o.prosecdef
    ),
    ARRAY['dq__count_rows', 'dq__count_truncated', 'dq__count_updated', 'dq__fold_counts'],
    'no pgdq function is SECURITY DEFINER but the count triggers and the fold (12_counts.sql)'
);
SELECT is(
    (
        SELECT array_agg(o.fn ORDER BY o.fn) FROM ours AS o
        WHERE
            NOT coalesce(array_to_string(o.proconfig, ',') LIKE 'search_path=pg_catalog%', FALSE)
            -- pure helpers qualify every name instead, so they can be inlined
            AND o.prosrc !~ ('(pg_catalog|' || o.nsp || ')\.')
    ),
    NULL,
    'every pgdq function pins search_path (or schema-qualifies everything)'
);

SELECT is(
    (
        SELECT array_agg(o.fn ORDER BY o.fn) FROM ours AS o
        WHERE 'enable_seqscan=off' = any(o.proconfig) AND NOT 'jit=off' = any(o.proconfig)
    ),
    NULL,
    'every pgdq function that turns seq scans off turns JIT off (10_storage.sql)'
);

SELECT is(dq_version(), '1.3.0', 'dq_version() is the package version');
SELECT is(
    dq_version(), (
        SELECT extversion FROM pg_extension
        WHERE extname = 'pgdq'
    ),
    'dq_version() matches the extension version'
);

SELECT set_config('dq.now', '2024-01-01 10:00:00+00', TRUE);
SELECT is(dq_now(), '2024-01-01 10:00:00+00'::timestamptz, 'dq_now() follows dq.now');
SELECT set_config('dq.now', '', TRUE);
SELECT ok(
    dq_now() BETWEEN clock_timestamp() - interval '1 minute' AND clock_timestamp(),
    'dq_now() is the wall clock when dq.now is empty'
);
SELECT set_config('dq.now', '', TRUE);
SELECT ok(dq_now() > now(), 'dq_now() is clock_timestamp(), not the transaction start');

-- dq.now must be a finite timestamp (api-v1.1)
SELECT set_config('dq.now', 'infinity', TRUE);
SELECT throws_ok(
    $$SELECT dq_now()$$, '22023', 'pgdq: dq.now must be a finite timestamp in years 1 to 9999 UTC, got ''infinity''',
    'an infinite dq.now is 22023'
);
SELECT throws_ok($$SELECT dq_offer('t_inst', 'k', '1')$$, '22023', NULL, 'and every function raises it');
SELECT set_config('dq.now', 'next tuesday', TRUE);
SELECT throws_ok(
    $$SELECT * FROM dq_poll('t_inst')$$, '22023',
    'pgdq: dq.now must be a finite timestamp in years 1 to 9999 UTC, got ''next tuesday''',
    'an unparsable dq.now is 22023'
);
SELECT set_config('dq.now', 'infinity', TRUE);
SELECT
    throws_ok(
        c.call, '22023', 'pgdq: dq.now must be a finite timestamp in years 1 to 9999 UTC, got ''infinity''',
        c.call || ' checks dq.now too'
    )
FROM (
    VALUES
    ($$SELECT dq_ack('00000000-0000-0001-0000-000000000000')$$),
    ($$SELECT dq_ack_many('{}')$$),
    ($$SELECT dq_cancel('t_inst', 'k')$$),
    ($$SELECT dq_purge('t_inst')$$),
    ($$SELECT dq_next_due('t_inst')$$),
    ($$SELECT dq_configure('t_inst', 3)$$),
    ($$SELECT * FROM dq_dead_list('t_inst')$$),
    ($$SELECT dq_dead_purge('t_inst')$$),
    ($$SELECT dq_schedule_remove('t_inst', 'nope')$$),
    ($$SELECT * FROM dq_get('t_inst', 'k')$$),
    ($$SELECT * FROM dq_stats()$$),
    ($$SELECT dq_cron_uninstall('t_inst', 'p')$$),
    ($$SELECT dq_dead_letter(NULL)$$),
    ($$SELECT * FROM dq_due_hours('t_inst')$$),
    ($$SELECT * FROM dq_key_queues('k')$$),
    ($$SELECT * FROM dq_dead_stats()$$)
) AS c (call);
SELECT set_config('dq.now', '', TRUE);
SELECT is(
    (
        SELECT array_agg(c.relname::text ORDER BY c.relname)
        FROM pg_extension AS e
        CROSS JOIN LATERAL unnest(e.extconfig) AS x (oid)
        INNER JOIN pg_class AS c ON x.oid = c.oid
        WHERE e.extname = 'pgdq'
    ),
    ARRAY[
        'dq_dead_letters', 'dq_groups', 'dq_history', 'dq_history_deltas', 'dq_history_tallies', 'dq_messages',
        'dq_messages_id_seq', 'dq_queues', 'dq_schedules', 'dq_turns'
    ],
    'pg_dump keeps every table and sequence of an extension install'
);

SELECT * FROM finish();
ROLLBACK;
