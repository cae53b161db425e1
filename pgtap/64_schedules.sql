-- Schedules kept by the database and dq_cron_next (additions to api-v1):
-- DST rules, materialisation by polls, catch-up, replacement, removal.
BEGIN;
SELECT plan(58);
SET LOCAL timezone = 'UTC';

-- dq_cron_next, DST edges included (the values croniter gives)
SELECT is(
    dq_cron_next('30 2 * * *', '2026-03-07 12:00-05', 'America/New_York'), '2026-03-08 07:00+00',
    'a time skipped by spring-forward fires at the end of the gap'
);
SELECT is(
    dq_cron_next('30 1 * * *', '2026-11-01 01:30-04', 'America/New_York'), '2026-11-01 06:30+00',
    'a time repeated by fall-back fires again in the second pass'
);
SELECT is(
    dq_cron_next('15 2 * * *', '2026-10-03 12:00+10:30', 'Australia/Lord_Howe'), '2026-10-03 15:30+00',
    'Lord Howe''s 30-minute gap likewise'
);
SELECT is(dq_cron_next('0 0 1 JAN-MAR 7', '2026-01-01 00:00Z', 'UTC'), '2026-01-04 00:00+00', 'day fields OR');
SELECT is(dq_cron_next('*/20 * * * * *', '2026-01-01 00:00:05Z', 'UTC'), '2026-01-01 00:00:20+00', 'seconds first');
SELECT is(dq_cron_next('0 0 30 2 *', now(), 'UTC'), NULL, 'never: NULL');
SELECT throws_ok($$SELECT dq_cron_next('* * * *', now(), 'UTC')$$, '22023', NULL, 'four fields');
SELECT throws_ok($$SELECT dq_cron_next('0 0 * * *', now(), 'Mars/Olympus')$$, '22023', NULL, 'unknown zone');

-- a schedule, polled as time goes by
SELECT set_config('dq.now', '2024-01-01 10:00:30+00', TRUE);
SELECT is(dq_schedule_set('t_s', 'tick', '* * * * *', 'UTC', '{"k": 1}'), '2024-01-01 10:01:00+00', 'set: next occurrence');
SELECT is(dq_next_due('t_s'), '2024-01-01 10:01:00+00'::timestamptz, 'dq_next_due counts it');
SELECT is((SELECT count(*)::int FROM dq_poll_many('t_s', 10)), 0, 'nothing due yet');
SELECT set_config('dq.now', '2024-01-01 10:01:00.5+00', TRUE);
CREATE TEMP TABLE p1 AS SELECT * FROM dq_poll_many('t_s', 10, '1 minute');
SELECT is(
    (SELECT array_agg(key || ' ' || payload::text) FROM p1),
    ARRAY['tick/' || dq__schedule_hash('* * * * *', 'UTC', '{"k": 1}') || '/20240101T100100.000000Z {"k": 1}'],
    'the poll turned the due occurrence into a message and leased it'
);
SELECT is((SELECT next_at FROM dq_schedules('t_s')), '2024-01-01 10:02:00+00'::timestamptz, 'next_at moved on');
SELECT dq_ack_many(array(SELECT lock_token FROM p1));
SELECT is((SELECT count(*)::int FROM dq_poll_many('t_s', 10)), 0, 'a second poll finds nothing new');

-- nobody polls for an hour: the most recent missed occurrence, once
SELECT set_config('dq.now', '2024-01-01 11:01:30+00', TRUE);
CREATE TEMP TABLE p2 AS SELECT * FROM dq_poll_many('t_s', 100, '1 minute');
SELECT is((SELECT array_agg(scheduled_at) FROM p2), ARRAY['2024-01-01 11:01:00+00'::timestamptz], 'no flood');
SELECT dq_ack_many(array(SELECT lock_token FROM p2));
SELECT dq_schedule_set('t_s', 'tick', '* * * * *', 'UTC', '{"k": 1}', 3);
SELECT set_config('dq.now', '2024-01-01 12:00:10+00', TRUE);
SELECT is(
    (SELECT array_agg(scheduled_at ORDER BY scheduled_at) FROM dq_poll_many('t_s', 100, '1 minute')),
    ARRAY['2024-01-01 11:58:00+00', '2024-01-01 11:59:00+00', '2024-01-01 12:00:00+00']::timestamptz[],
    'max_missed 3: the three most recent'
);

-- the same configuration keeps its place; a new one replaces pending occurrences
SELECT set_config('dq.now', '2024-01-01 12:00:20+00', TRUE);
SELECT is(
    dq_schedule_set('t_s', 'tick', '* * * * *', 'UTC', '{"k": 1}', 3), '2024-01-01 12:01:00+00',
    'setting the same configuration again changes nothing'
);
SELECT dq_cron_install(
    't_s', 'tick', dq__schedule_hash('* * * * *', 'UTC', '{"k": 1}'),
    ARRAY['2024-01-01 13:00+00']::timestamptz[], ARRAY['{}']::jsonb[]
);  -- a pending occurrence
SELECT is(
    dq_schedule_set('t_s', 'tick', '0 * * * *', 'Europe/Bucharest', '{"k": 2}'), '2024-01-01 13:00:00+00',
    'a new configuration starts from its own next occurrence'
);
SELECT is(
    (
        SELECT count(*)::int FROM dq_stats('t_s')
        WHERE delayed = 0 AND leased = 3
    ), 1,
    'its pending occurrences went, the leased ones stayed'
);

-- two schedules, listed; removal
SELECT dq_schedule_set('t_s2', 'daily', '0 9 * * *', 'America/New_York');
SELECT is((SELECT array_agg(name ORDER BY queue) FROM dq_schedules()), ARRAY['tick', 'daily'], 'listed');
SELECT ok(dq_schedule_remove('t_s', 'tick'), 'remove');
SELECT ok(NOT dq_schedule_remove('t_s', 'tick'), 'remove again: false');
SELECT is(dq_next_due('t_s2'), '2024-01-01 14:00:00+00'::timestamptz, 'next_due of a queue with only a schedule');

-- bad input
SELECT throws_ok($$SELECT dq_schedule_set('t_s', 'a/b', '* * * * *')$$, '22023', NULL, 'a name with /');
SELECT throws_ok($$SELECT dq_schedule_set('t_s', 'x', '* * * * *', 'UTC', '{}', 0)$$, '22023', NULL, 'max_missed 0');
SELECT throws_ok($$SELECT dq_schedule_set('t_s', 'x', '0 0 30 2 *')$$, '22023', NULL, 'a schedule that never fires');
SELECT is((SELECT count(*)::int FROM dq_schedules('t_s')), 0, 'and nothing was written');

-- bounded input (api-v1.1)
SELECT throws_ok(
    format('SELECT dq_cron_next(%L, now(), %L)', repeat('1,', 500) || '1 * * * *', 'UTC'), '22023',
    'pgdq: expression must be at most 1000 characters, got 1009', 'an expression over 1,000 characters is 22023'
);
SELECT throws_ok(
    format('SELECT dq_schedule_set(%L, %L, %L)', 't_s', 'long', repeat(' ', 1000) || '* * * * *'), '22023',
    NULL, 'dq_schedule_set checks it too'
);
SELECT throws_ok(
    $$SELECT dq_cron_next('* * * * *', 'infinity', 'UTC')$$, '22023',
    'pgdq: after must be a time in years 1 to 9999 UTC, got infinity', 'an infinite after is 22023'
);
SELECT lives_ok(
    format(
        'SELECT dq_cron_next(%L, now(), %L)',
        repeat('0-59,', 59) || '0-59 ' || repeat('0-59,', 59) || '0-59 * * * *', 'UTC'
    ),
    'a long expression within the limits works'
);

-- bounded parsing (api-v1.1): list sizes, names, the timestamp range
SELECT throws_ok(
    format('SELECT dq_cron_next(%L, now(), %L)', '0' || repeat(',0', 60) || ' * * * *', 'UTC'), '22023',
    'pgdq: minute field has 61 list items, at most 60', 'a list of more than 60 items is 22023'
);
SELECT is(
    dq_cron_next(
        array_to_string(array(SELECT g.g FROM generate_series(0, 59) AS g (g)), ',') || ' 0 * * *', '2024-01-01 10:00Z', 'UTC'
    ),
    '2024-01-02 00:00+00', 'a list of 60 items is fine'
);
SELECT throws_ok(
    format('SELECT dq_cron_next(%L, now(), %L)', repeat('59,', 16666) || '59 * * * *', 'UTC'), '22023',
    'pgdq: expression must be at most 1000 characters, got 50008', 'a 50,000-character expression is 22023'
);
SELECT throws_ok(
    $$SELECT dq_cron_next('0 0 * jan-mon *', now(), 'UTC')$$, '22023',
    'pgdq: unknown name ''mon'' in month field ''jan-mon''', 'an unknown name is called unknown, not out of range'
);
SELECT throws_ok(
    $$SELECT dq_cron_next('* * * * *', '10000-01-01 00:00Z', 'UTC')$$, '22023',
    'pgdq: after must be a time in years 1 to 9999 UTC, got 10000-01-01 00:00:00+00',
    'an after past the readable range is 22023 (1.2)'
);
SELECT throws_ok(
    $$SELECT * FROM dq_schedules('')$$, '22023', 'pgdq: queue must be 1 to 100 characters long, got 0',
    'dq_schedules checks a given queue name'
);

-- dq_schedule_set never returns a past time
SELECT set_config('dq.now', '2024-01-01 10:00:30+00', TRUE);
SELECT dq_schedule_set('t_past', 'tick', '* * * * *');
SELECT set_config('dq.now', '2024-01-01 10:05:30+00', TRUE);
SELECT is(
    dq_schedule_set('t_past', 'tick', '* * * * *'), '2024-01-01 10:06:00+00'::timestamptz,
    'the same configuration again, unpolled since it came due: the next occurrence after now'
);
SELECT is(
    (SELECT array_agg(scheduled_at) FROM dq_poll_many('t_past', 10)), ARRAY['2024-01-01 10:05:00+00'::timestamptz],
    'and the next poll still delivers the occurrence that came due'
);

-- an every-second schedule across the fall-back, idle for 30 minutes,
-- max_missed 100: the 100 most recent occurrences (1.0.0 took 54 s)
SELECT set_config('dq.now', '2026-11-01 05:40:00+00', TRUE);
SELECT dq_schedule_set('t_dst', 'sec', '* * * * * *', 'America/New_York', '{}', 100);
SELECT set_config('dq.now', '2026-11-01 06:10:00+00', TRUE);
SET LOCAL statement_timeout = '10s';
SELECT is(
    (SELECT array_agg(scheduled_at ORDER BY scheduled_at) FROM dq_poll_many('t_dst', 1000)),
    array(
        SELECT g.at FROM generate_series('2026-11-01 06:08:21+00'::timestamptz, '2026-11-01 06:10:00+00', '1 second') AS g (at)
    ),
    'a poll after 30 idle minutes of an every-second schedule across the fall-back'
);
SET LOCAL statement_timeout = 0;

-- A schedule whose next occurrence would fall after year 9999 ends (1.2):
-- its last occurrence is delivered and its next_at is NULL (1.1: infinity,
-- which clients cannot read).
SELECT set_config('dq.now', '9999-12-31 19:00:00+00', TRUE);
SELECT dq_schedule_set('t_end', 'yearly', '0 20 31 12 *');
SELECT dq_offer('t_end', 'plain', '{}');
SELECT set_config('dq.now', '9999-12-31 23:00:00+00', TRUE);
SELECT is(
    (SELECT array_agg(key ORDER BY key) FROM dq_poll_many('t_end', 10, '1 minute')),
    ARRAY['plain', 'yearly/' || dq__schedule_hash('0 20 31 12 *', 'UTC', '{}') || '/99991231T200000.000000Z'],
    'the last occurrence before year 10000 is delivered'
);
SELECT is(
    (SELECT (last_error, failures, next_at)::text FROM dq_schedules('t_end')),
    (NULL::text, 0, NULL::timestamptz)::text,
    'then the schedule has ended: next_at NULL, no error'
);
SELECT is(dq_next_due('t_end'), '9999-12-31 23:01:00+00', 'an ended schedule adds nothing to dq_next_due');
SELECT is(
    (SELECT array_agg(key) FROM dq_poll_many('t_end', 10, '1 minute')), NULL, 'nor to later polls'
);

SELECT set_config('dq.now', '2024-01-01 10:00:30+00', TRUE);
SELECT dq_schedule_set('t_bad', 'huge', '* * * * *');
-- as a 1.0.0 install could have stored it
UPDATE dq_schedules SET expression = repeat('59,', 16666) || '59 * * * *'
WHERE queue = 't_bad';
SELECT dq_offer('t_bad', 'plain', '{}');
SELECT set_config('dq.now', '2024-01-01 10:01:30+00', TRUE);
SELECT is(
    (SELECT array_agg(key) FROM dq_poll_many('t_bad', 10)), ARRAY['plain'],
    'a schedule with a 50,000-character expression does not stop the poll'
);
SELECT is(
    (SELECT (last_error, last_error_at, failures, next_at)::text FROM dq_schedules('t_bad')),
    (
        'pgdq: expression must be at most 1000 characters, got 50008 (SQLSTATE 22023)',
        '2024-01-01 10:01:30+00'::timestamptz, 1, '2024-01-01 10:02:30+00'::timestamptz
    )::text,
    'its error shows; it is tried again in a minute'
);
SELECT is(dq_next_due('t_bad'), '2024-01-01 10:02:30+00'::timestamptz, 'dq_next_due counts the next attempt');
SELECT set_config('dq.now', '2024-01-01 10:02:29+00', TRUE);
SELECT dq_poll_many('t_bad', 10);
SELECT is((SELECT failures FROM dq_schedules('t_bad')), 1, 'not before');
SELECT set_config('dq.now', '2024-01-01 10:02:30+00', TRUE);
SELECT dq_poll_many('t_bad', 10);
SELECT is(
    (SELECT (failures, next_at)::text FROM dq_schedules('t_bad')), (2, '2024-01-01 10:04:30+00'::timestamptz)::text,
    'then 2 minutes later'
);
SELECT is(
    dq_schedule_set('t_bad', 'huge', '* * * * *'), '2024-01-01 10:03:00+00'::timestamptz,
    'dq_schedule_set mends it'
);
SELECT is(
    (SELECT array_agg(scheduled_at) FROM dq_poll_many('t_bad', 10)), ARRAY['2024-01-01 10:02:00+00'::timestamptz],
    'and the next poll delivers what it missed (max_missed 1: the latest)'
);
SELECT is(
    (SELECT (last_error, last_error_at, failures, next_at)::text FROM dq_schedules('t_bad')),
    (NULL::text, NULL::timestamptz, 0, '2024-01-01 10:03:00+00'::timestamptz)::text,
    'a success clears the error'
);

-- errors of the schedule's own statements (a trigger), and a statement
-- timeout that fires while a schedule is materialised
CREATE FUNCTION pg_temp.t_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.key LIKE 'hourly/%' THEN
        RAISE EXCEPTION 'refused by a trigger';
    ELSIF NEW.key LIKE 'stall/%' THEN
        PERFORM pg_sleep(10);
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER t_refuse BEFORE INSERT ON dq_messages FOR EACH ROW EXECUTE FUNCTION pg_temp.t_refuse();
SELECT set_config('dq.now', '2024-01-01 09:30:00+00', TRUE);
SELECT dq_schedule_set('t_flaky', 'hourly', '0 * * * *');
SELECT dq_offer('t_flaky', 'plain', '{}');
SELECT dq_schedule_set('t_slow', 'stall', '0 * * * *');
SELECT dq_offer('t_slow', 'plain', '{}');
SELECT set_config('dq.now', '2024-01-01 10:00:30+00', TRUE);
SELECT is(
    (SELECT array_agg(key) FROM dq_poll_many('t_flaky', 10)), ARRAY['plain'],
    'a schedule whose insert fails does not stop the poll'
);
SELECT is(
    (SELECT last_error FROM dq_schedules('t_flaky')), 'refused by a trigger (SQLSTATE P0001)', 'its error shows'
);
SET LOCAL statement_timeout = '1s';  -- the stalled insert sleeps 10 s; the poll's own work takes milliseconds
SELECT is(
    (SELECT array_agg(key) FROM dq_poll_many('t_slow', 10)), ARRAY['plain'],
    'a poll whose statement timeout fires while a schedule is materialised still delivers the other messages'
);
SET LOCAL statement_timeout = 0;
SELECT is(
    (SELECT (last_error LIKE '% (SQLSTATE 57014)', failures) FROM dq_schedules('t_slow')), (TRUE, 1),
    'the timeout is that schedule''s error'
);
DROP TRIGGER t_refuse ON dq_messages;
SELECT set_config('dq.now', '2024-01-01 10:01:30+00', TRUE);
SELECT is(
    (SELECT array_agg(scheduled_at) FROM dq_poll_many('t_flaky', 10)), ARRAY['2024-01-01 10:00:00+00'::timestamptz],
    'tried again, it delivers the occurrence that failed'
);
SELECT is(
    (SELECT (last_error, failures, next_at)::text FROM dq_schedules('t_flaky')),
    (NULL::text, 0, '2024-01-01 11:00:00+00'::timestamptz)::text, 'and is well again'
);

SELECT * FROM finish();
ROLLBACK;
