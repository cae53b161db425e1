-- dq_cron_install / dq_cron_uninstall: occurrence keys, replacement of
-- other configurations, leased occurrences kept, past ones skipped, literal
-- prefixes, bad input.
BEGIN;
SELECT plan(31);
SELECT set_config('dq.now', '2024-01-01 10:00:00+00', TRUE);
SET LOCAL TimeZone = 'America/New_York';

SELECT is(
    dq_cron_install(
        't_cron', 'report', 'h1',
        ARRAY['2024-01-01 11:00:00+00', '2024-01-01 12:00:00.25+02', '2024-01-01 09:00:00+00', '2024-01-01 10:00:00+00']::timestamptz[],
        ARRAY['{"n": 1}', '{"n": 2}', '{"n": 0}', '{"n": 9}']::jsonb[]
    ),
    2, 'creates the future occurrences and returns their count'
);
SELECT results_eq(
    $$SELECT key COLLATE "default", payload, scheduled_at FROM dq_messages WHERE queue = 't_cron' ORDER BY key$$,
    $$VALUES ('report/h1/20240101T100000.250000Z'::text, '{"n": 2}'::jsonb, '2024-01-01 10:00:00.25+00'::timestamptz),
             ('report/h1/20240101T110000.000000Z'::text, '{"n": 1}'::jsonb, '2024-01-01 11:00:00+00'::timestamptz)$$,
    'occurrence keys are prefix/hash/UTC time with microseconds; at or before now is skipped'
);

SELECT is(dq_cron_install(
    't_cron', 'report', 'h1',
    ARRAY['2024-01-01 11:00:00+00']::timestamptz[], ARRAY['{"n": 5}']::jsonb[]
),
0, 'installing the same occurrence again creates nothing');
SELECT is(
    (SELECT payload FROM dq_get('t_cron', 'report/h1/20240101T110000.000000Z')), '{"n": 1}'::jsonb,
    'can_update defaults to false: the occurrence is unchanged'
);
SELECT is(dq_cron_install(
    't_cron', 'report', 'h1',
    ARRAY['2024-01-01 11:00:00+00']::timestamptz[], ARRAY['{"n": 5}']::jsonb[], TRUE
),
0, 'with can_update an existing occurrence is updated, not created');
SELECT is((SELECT payload FROM dq_get('t_cron', 'report/h1/20240101T110000.000000Z')), '{"n": 5}'::jsonb, 'updated');
SELECT is(
    (
        SELECT count(*)::int FROM dq_messages
        WHERE queue = 't_cron'
    ), 2,
    'occurrences of the same configuration that were not offered again are kept'
);

-- a changed configuration replaces pending occurrences, leaves leased ones
SELECT set_config('dq.now', '2024-01-01 10:00:01+00', TRUE);
SELECT is((SELECT key FROM dq_poll('t_cron', '1 hour')), 'report/h1/20240101T100000.250000Z', 'lease one h1 occurrence');
SELECT dq_offer('t_cron', 'reportx/h1/20240101T110000.000000Z', '1', '2024-01-01 11:00:00+00');
SELECT dq_offer('t_cron', 'repor/h1/20240101T110000.000000Z', '1', '2024-01-01 11:00:00+00');
SELECT dq_offer('t_cron2', 'report/h1/20240101T110000.000000Z', '1', '2024-01-01 11:00:00+00');
SELECT is(dq_cron_install(
    't_cron', 'report', 'h2',
    ARRAY['2024-01-01 11:00:00+00', '2024-01-01 13:00:00+00']::timestamptz[], ARRAY['{}', '{}']::jsonb[]
),
2, 'a new configuration creates its occurrences');
SELECT results_eq(
    $$SELECT key COLLATE "default" FROM dq_messages WHERE queue = 't_cron' ORDER BY key$$,
    $$VALUES ('repor/h1/20240101T110000.000000Z'::text),
             ('report/h1/20240101T100000.250000Z'::text),
             ('report/h2/20240101T110000.000000Z'::text),
             ('report/h2/20240101T130000.000000Z'::text),
             ('reportx/h1/20240101T110000.000000Z'::text)$$,
    'the old configuration''s pending occurrence is gone, its leased one stays, other prefixes are untouched'
);
SELECT is((
    SELECT count(*)::int FROM dq_messages
    WHERE queue = 't_cron2'
), 1, 'other queues are untouched');
SELECT is(dq_cron_install(
    't_cron', 'report', 'h1',
    ARRAY['2024-01-01 11:00:00+00']::timestamptz[], ARRAY['{}']::jsonb[]
),
1, 'the last installer wins (rolling deploy back to h1)');
SELECT is((
    SELECT count(*)::int FROM dq_messages
    WHERE queue = 't_cron' AND key LIKE 'report/h2/%'
), 0, 'h2 is replaced');

-- LIKE characters in a prefix are literal
SELECT dq_offer('t_cron', 'r_port/h9/20240101T110000.000000Z', '1', '2024-01-01 11:00:00+00');
SELECT dq_offer('t_cron', '%/h9/20240101T110000.000000Z', '1', '2024-01-01 11:00:00+00');
SELECT is(dq_cron_uninstall('t_cron', 'r_port'), 1, 'uninstall r_port removes only r_port/...');
SELECT is(dq_cron_uninstall('t_cron', '%'), 1, 'uninstall % removes only %/...');
SELECT is((
    SELECT count(*)::int FROM dq_messages
    WHERE queue = 't_cron' AND key LIKE 'report/%'
), 2, 'report/... untouched');

-- uninstall
SELECT is(dq_cron_uninstall('t_cron', 'report', 'h2'), 0, 'uninstall of a hash with no occurrences: 0');
SELECT is(dq_cron_uninstall('t_cron', 'report', 'h1'), 1, 'uninstall with a hash deletes its pending occurrences');
SELECT is(
    (
        SELECT count(*)::int FROM dq_messages
        WHERE queue = 't_cron' AND key LIKE 'report/%'
    ), 1,
    'the leased occurrence is left alone'
);
SELECT set_config('dq.now', '2024-01-01 11:00:02+00', TRUE);
SELECT is(dq_cron_uninstall('t_cron', 'report'), 1, 'once its lease expired, uninstall deletes it');

-- bad input: clear errors, nothing written
SELECT
    throws_ok(
        $$SELECT dq_cron_install('t_bad', 'a/b', 'h', '{}', '{}')$$, '22023', 'pgdq: key_prefix must not contain "/"', 'prefix with /'
    );
SELECT
    throws_ok(
        $$SELECT dq_cron_install('t_bad', 'a', 'h/x', '{}', '{}')$$, '22023', 'pgdq: config_hash must not contain "/"', 'hash with /'
    );
SELECT throws_ok(
    $$SELECT dq_cron_install('t_bad', repeat('p', 101), 'h', '{}', '{}')$$, '22023',
    'pgdq: key_prefix must be 1 to 100 characters long, got 101', 'prefix too long'
);
SELECT throws_ok(
    $$SELECT dq_cron_install('t_bad', 'p', repeat('h', 65), '{}', '{}')$$, '22023',
    'pgdq: config_hash must be 1 to 64 characters long, got 65', 'hash too long'
);
SELECT throws_ok(
    $$SELECT dq_cron_install('t_bad', 'p', 'h', ARRAY['2030-01-01']::timestamptz[], '{}')$$, '22023',
    'pgdq: scheduled_ats and payloads must be one-dimensional arrays of equal length, got 1 and 0', 'unequal lengths'
);
SELECT throws_ok(
    $$SELECT dq_cron_install('t_bad', 'p', 'h', ARRAY['2030-01-01', NULL]::timestamptz[], ARRAY['1', '2']::jsonb[])$$, '22004',
    'pgdq: scheduled_ats[2] must not be NULL', 'a NULL time'
);
SELECT throws_ok(
    $$SELECT dq_cron_install('t_bad', 'p', 'h', ARRAY['2030-01-01']::timestamptz[], ARRAY[NULL]::jsonb[])$$, '22004',
    'pgdq: payloads[1] must not be NULL', 'a NULL payload'
);
SELECT throws_ok($$SELECT dq_cron_install('t_bad', 'p', NULL, '{}', '{}')$$, '22004', 'pgdq: config_hash must not be NULL', 'NULL hash');
SELECT is((
    SELECT count(*)::int FROM dq_messages
    WHERE queue = 't_bad'
), 0, 'bad installs wrote nothing');

-- infinite occurrences (api-v1.1)
SELECT throws_ok(
    $$SELECT dq_cron_install('t_cron_inf', 'p', 'h', ARRAY['2030-01-01', 'infinity']::timestamptz [], ARRAY['1', '2']::jsonb[])$$,
    '22023', 'pgdq: scheduled_ats[2] must be a time in years 1 to 9999 UTC, got infinity', 'an infinite occurrence is 22023'
);
SELECT is((
    SELECT count(*)::int FROM dq_stats('t_cron_inf')
    WHERE delayed > 0
), 0, 'and nothing was written');

SELECT * FROM finish();
ROLLBACK;
