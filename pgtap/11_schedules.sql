-- Schedules kept by the database and dq_cron_next (additions to api-v1):
-- DST rules, materialisation by polls, catch-up, replacement, removal.
BEGIN;
SELECT plan(31);
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
    'pgdq: after must be a finite time, got infinity', 'an infinite after is 22023'
);
SELECT lives_ok(
    format('SELECT dq_cron_next(%L, now(), %L)', repeat('59,', 330) || '59 * * * *', 'UTC'),
    'a long expression within the limit works'
);

SELECT * FROM finish();
ROLLBACK;
