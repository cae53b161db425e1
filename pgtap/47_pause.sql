-- Pause and resume (1.2): a paused queue leases nothing to any poll and has
-- no next due time; everything else works; resume wakes its consumers.
BEGIN;
SELECT plan(29);
SELECT set_config('dq.now', '2024-01-01 10:00:00+00', TRUE);

SELECT dq_offer('t_pause', 'a', '1', '2024-01-01 09:00+00');
SELECT dq_offer('t_pause', 'b', '2', '2024-01-01 09:30+00');
SELECT is((SELECT key FROM dq_poll('t_pause', '1 minute')), 'a', 'a running queue delivers');
SELECT is((SELECT key FROM dq_poll('t_pause', '1 second')), 'b', 'b too, on a lease that will expire');
SELECT is(dq_pause('t_pause'), TRUE, 'dq_pause of a running queue: true');
SELECT is(dq_pause('t_pause'), FALSE, 'dq_pause of a paused queue: false');
SELECT dq_offer('t_pause', 'e', '6', '2024-01-01 08:00+00');  -- due, first in the queue
SELECT is((SELECT count(*)::int FROM dq_poll('t_pause')), 0, 'dq_poll leases nothing');
SELECT is((SELECT count(*)::int FROM dq_poll_many('t_pause', 10)), 0, 'dq_poll_many leases nothing');
SELECT is((SELECT count(*)::int FROM dq_ack_poll('{}', 't_pause', 10)), 0, 'the poll of dq_ack_poll leases nothing');
SELECT is(dq_next_due('t_pause'), NULL, 'dq_next_due is NULL');
SELECT is((SELECT paused FROM dq_stats('t_pause')), TRUE, 'dq_stats says paused');
SELECT is((
    SELECT paused FROM dq_stats()
    WHERE queue = 't_pause'
), TRUE, 'and so does the overview');

-- everything else works
SELECT is(dq_offer('t_pause', 'c', '3'), 'created', 'offers work');
SELECT ok(dq_send('t_pause', '4') > 0, 'sends work');
SELECT is(dq_cancel('t_pause', 'c'), TRUE, 'cancels work');
SELECT set_config('dq.now', '2024-01-01 10:00:30+00', TRUE);
SELECT is(
    dq_extend((
        SELECT lock_token FROM dq_messages
        WHERE queue = 't_pause' AND key = 'a'
    ), '5 minutes'),
    '2024-01-01 10:05:30+00'::timestamptz,
    'a lease taken before the pause can be extended'
);
SELECT is(
    dq_ack((
        SELECT lock_token FROM dq_messages
        WHERE queue = 't_pause' AND key = 'a'
    ), 't_pause'), TRUE,
    'and acked'
);
SELECT dq_schedule_set('t_pause', 'tick', '* * * * *');
SELECT set_config('dq.now', '2024-01-01 10:01:30+00', TRUE);
SELECT is((SELECT count(*)::int FROM dq_poll('t_pause')), 0, 'a poll of the paused queue still leases nothing');
SELECT is(
    (
        SELECT count(*)::int FROM dq_messages
        WHERE queue = 't_pause' AND key LIKE 'tick%'
    ), 1,
    'but its schedule''s due occurrence became a message'
);
SELECT dq_configure('t_pause', 1);
SELECT is((SELECT count(*)::int FROM dq_poll('t_pause')), 0, 'a poll of the paused queue leases nothing');
SELECT is(
    (
        SELECT count(*)::int FROM dq_dead_stats('t_pause')
        WHERE dead > 0
    ), 0,
    'nor buries b, whose lease expired after its one allowed delivery'
);

-- a pause outlives the queue's messages, and other queues are not paused
SELECT dq_purge('t_pause');
SELECT dq_offer('t_other', 'x', '1');
SELECT is((SELECT key FROM dq_poll('t_other')), 'x', 'another queue delivers');
SELECT dq_offer('t_pause', 'd', '5');
SELECT is((SELECT count(*)::int FROM dq_poll('t_pause')), 0, 'a pause outlives the queue''s messages');
SELECT is((
    SELECT max_attempts FROM dq_queues
    WHERE queue = 't_pause'
), 1, 'and keeps the queue''s settings');

-- resume
SELECT is(dq_resume('t_pause'), TRUE, 'dq_resume of a paused queue: true');
SELECT is(dq_resume('t_pause'), FALSE, 'dq_resume of a running queue: false');
SELECT is((SELECT key FROM dq_poll('t_pause')), 'd', 'a resumed queue delivers');
SELECT is((SELECT paused FROM dq_stats('t_pause')), FALSE, 'dq_stats says not paused');
SELECT is(dq_pause('t_empty_pause'), TRUE, 'a queue with no message can be paused');

-- errors
SELECT throws_ok($$SELECT dq_pause(NULL)$$, '22004', 'pgdq: queue must not be NULL', 'dq_pause: NULL queue');
SELECT throws_ok(
    $$SELECT dq_resume(repeat('q', 101))$$, '22023', 'pgdq: queue must be 1 to 100 characters long, got 101',
    'dq_resume: queue too long'
);

SELECT * FROM finish();
ROLLBACK;
