-- Times are readable (1.2): every time a function accepts, stores or returns
-- lies in years 1 to 9999 UTC. A time outside it is 22023 naming the
-- argument and writes nothing; a lease ending past it too; a schedule whose
-- next occurrence (or retry) would fall past it ends (next_at NULL).
BEGIN;
SELECT plan(53);
SET LOCAL timezone = 'UTC';
SELECT set_config('dq.now', '2024-01-01 10:00:00+00', TRUE);

-- the SQLSTATE and message a call raises; NULL when it succeeds
CREATE FUNCTION pg_temp.error_of(call text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE call;
    RETURN NULL;
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ' ' || SQLERRM;
END
$$;

-- what the calls below could change
CREATE FUNCTION pg_temp.written() RETURNS text LANGUAGE sql AS $$
    SELECT concat_ws(
        ' / ',
        (SELECT string_agg(concat_ws(' ', key, due_at, lock_token), ', ' ORDER BY key) FROM dq_messages WHERE queue = 't_tm'),
        (SELECT string_agg(key, ', ' ORDER BY key) FROM dq_dead_letters WHERE queue = 't_tm')
    )
$$;

SELECT dq_offer('t_tm', 'n', '1');
SELECT dq_offer('t_tm', 'd', '1');
CREATE TEMP TABLE tokens AS SELECT
    key,
    lock_token
FROM dq_poll_many('t_tm', 2, '1 hour');
SELECT dq_dead_letter((
    SELECT lock_token FROM tokens
    WHERE key = 'd'
), 'gone');
CREATE TEMP TABLE before_calls AS SELECT pg_temp.written() AS written;

-- every time argument, with each kind of time outside the range
CREATE TEMP TABLE bad_times (at text);
INSERT INTO bad_times VALUES ('infinity'), ('-infinity'), ('10000-01-01 00:00:00+00'), ('0001-01-01 00:00:00+00 BC');
CREATE TEMP TABLE time_calls (call text, arg_name text);
INSERT INTO time_calls VALUES
('SELECT dq_offer(''t_tm'', ''new'', ''1'', %L)', 'scheduled_at'),
('SELECT dq_offer(''t_tm'', ''n'', ''2'', %L)', 'scheduled_at'),
('SELECT * FROM dq_offer_many(''t_tm'', ARRAY[''a'', ''b''], ARRAY[''1'', ''2'']::jsonb[], ARRAY[now(), %L])', 'scheduled_ats[2]'),
('SELECT dq_nack((SELECT lock_token FROM tokens WHERE key = ''n''), %L)', 'retry_at'),
('SELECT dq_dead_redrive(''t_tm'', NULL, %L)', 'scheduled_at'),
('SELECT dq_dead_redrive(''t_tm'', ''d'', %L)', 'scheduled_at'),
(
    'SELECT dq_cron_install(''t_tm'', ''p'', ''h'', ARRAY[''2030-01-01'', %L]::timestamptz[], ARRAY[''1'', ''2'']::jsonb[])',
    'scheduled_ats[2]'
),
('SELECT dq_cron_next(''* * * * *'', %L, ''UTC'')', 'after');

SELECT
    matches(
        pg_temp.error_of(format(c.call, b.at)),
        format('^22023 pgdq: %s must be a time in years 1 to 9999 UTC, got ', regexp_replace(c.arg_name, '([][])', '\\\1', 'g')),
        format(c.call, b.at) || ': 22023 naming ' || c.arg_name
    )
FROM time_calls AS c CROSS JOIN bad_times AS b
ORDER BY c.call, b.at;
SELECT is(pg_temp.written(), (SELECT written FROM before_calls), 'none of them wrote anything');

-- the edges of the range are in it
SELECT is(dq_offer('t_tm', 'first', '1', '0001-01-01 00:00:00+00'), 'created', 'the first time of year 1 UTC is accepted');
SELECT is(
    dq_offer('t_tm', 'last', '1', '9999-12-31 23:59:59.999999+00'), 'created', 'the last time of year 9999 UTC too'
);
SELECT is(
    (SELECT scheduled_at FROM dq_get('t_tm', 'last')), '9999-12-31 23:59:59.999999+00'::timestamptz, 'and read back'
);

-- the test clock
CREATE FUNCTION pg_temp.with_clock(at text, call text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_error text;
BEGIN
    PERFORM set_config('dq.now', at, TRUE);
    v_error := pg_temp.error_of(call);
    PERFORM set_config('dq.now', '2024-01-01 10:00:00+00', TRUE);
    RETURN v_error;
END
$$;
SELECT
    is(
        pg_temp.with_clock(b.at, $$SELECT dq_offer('t_tm', 'clock', '1')$$),
        format('22023 pgdq: dq.now must be a finite timestamp in years 1 to 9999 UTC, got %L', b.at),
        'dq.now ' || b.at || ': 22023 naming dq.now'
    )
FROM bad_times AS b
ORDER BY b.at;
SELECT is(
    (
        SELECT count(*)::int FROM dq_messages
        WHERE queue = 't_tm' AND key = 'clock'
    ), 0, 'and nothing was offered'
);

-- now + lease: polls and extends
SELECT set_config('dq.now', '9999-12-31 23:00:00+00', TRUE);
SELECT dq_offer('t_tm_lease', 'k', '1');
SELECT
    matches(
        pg_temp.error_of(c.call),
        '^22023 pgdq: lease 01:00:00 from 9999-12-31 23:00:00\+00 ends after year 9999 UTC$',
        c.call || ': a lease ending at the end of year 9999 is 22023 naming lease'
    )
FROM (
    VALUES
    ($$SELECT * FROM dq_poll('t_tm_lease', '1 hour')$$),
    ($$SELECT * FROM dq_poll_many('t_tm_lease', 5, '1 hour')$$),
    ($$SELECT * FROM dq_ack_poll('{}', 't_tm_lease', 5, '1 hour')$$)
) AS c (call);
SELECT is(
    (
        SELECT count(*)::int FROM dq_messages
        WHERE queue = 't_tm_lease' AND lock_token IS NULL
    ), 1, 'nothing was leased'
);
CREATE TEMP TABLE lease_token AS SELECT lock_token FROM dq_poll('t_tm_lease', '59 minutes 59.999999 seconds');
SELECT is(
    (SELECT lease_until FROM dq_peek('t_tm_lease')), '9999-12-31 23:59:59.999999+00'::timestamptz,
    'a lease ending at the last time of year 9999 is fine'
);
SELECT matches(
    pg_temp.error_of(format('SELECT dq_extend(%L, %L)', (SELECT lock_token FROM lease_token), '1 hour')),
    '^22023 pgdq: lease 01:00:00 from 9999-12-31 23:00:00\+00 ends after year 9999 UTC$',
    'dq_extend: 22023 naming lease'
);
SELECT is(
    (SELECT lease_until FROM dq_peek('t_tm_lease')), '9999-12-31 23:59:59.999999+00'::timestamptz,
    'and the lease is as it was'
);

-- a schedule whose retry after a failure would fall past year 9999 ends
SELECT set_config('dq.now', '9999-12-31 20:00:00+00', TRUE);
SELECT dq_schedule_set('t_tm_sched', 'failing', '45 * * * *');
UPDATE dq_schedules SET expression = repeat('59,', 16666) || '59 * * * *', failures = 6
WHERE queue = 't_tm_sched';
SELECT set_config('dq.now', '9999-12-31 23:30:00+00', TRUE);
SELECT dq_poll_many('t_tm_sched', 10);
SELECT is(
    (SELECT (failures, next_at)::text FROM dq_schedules('t_tm_sched')), (7, NULL::timestamptz)::text,
    'a failing schedule whose next attempt would be in year 10000 ends (next_at NULL)'
);
SELECT is(
    dq_schedule_set('t_tm_sched', 'failing', '45 * * * *'), '9999-12-31 23:45:00+00'::timestamptz,
    'setting it again starts it again'
);
SELECT is(
    (SELECT (failures, next_at)::text FROM dq_schedules('t_tm_sched')),
    (0, '9999-12-31 20:45:00+00'::timestamptz)::text, 'from the occurrence it missed'
);
SELECT set_config('dq.now', '9999-12-31 23:50:00+00', TRUE);
SELECT throws_ok(
    $$SELECT dq_schedule_set('t_tm_sched', 'late', '45 * * * *')$$, '22023',
    'pgdq: ''45 * * * *'' names no time in the next 5 years (before year 10000 UTC)',
    'a schedule whose first occurrence would be in year 10000 is 22023'
);
SELECT is(dq_cron_next('45 * * * *', '9999-12-31 23:50:00+00', 'UTC'), NULL, 'dq_cron_next: none past year 9999');

SELECT * FROM finish();
ROLLBACK;
