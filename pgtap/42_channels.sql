-- Channels and priority: arguments, outcomes, the turn rule within one poll
-- and across polls, priority within a group, limits (counted with the same
-- call's leases, freed by expiry, ack, nack, cancel and update), removal,
-- dq_next_due and dq_channels, with a pinned clock.
BEGIN;
SELECT plan(77);
SELECT set_config('dq.now', '2024-01-01 12:00:00+00', TRUE);

-- the keys one poll leases, in delivery order
CREATE FUNCTION pg_temp.taken(queue text, max_count integer, lease interval DEFAULT '1 minute') RETURNS text
LANGUAGE sql AS $$
    SELECT coalesce(string_agg(d.key, ' ' ORDER BY d.ordinality), '')
    FROM dq_poll_many(queue, max_count, lease) WITH ORDINALITY AS d
$$;

-- offer keys (space-separated) into a channel, due at one time
CREATE FUNCTION pg_temp.offer(
    queue text, keys text, channel text, at timestamptz, priority integer DEFAULT 0
) RETURNS void
LANGUAGE sql AS $$
    SELECT count(*) FROM dq_offer_many(
        queue, string_to_array(keys, ' '),
        array_fill('{}'::jsonb, ARRAY[cardinality(string_to_array(keys, ' '))]),
        array_fill(at, ARRAY[cardinality(string_to_array(keys, ' '))]),
        TRUE,
        array_fill(channel, ARRAY[cardinality(string_to_array(keys, ' '))]),
        array_fill(priority, ARRAY[cardinality(string_to_array(keys, ' '))])
    )
$$;

-- arguments
SELECT throws_ok(
    $$SELECT dq_offer('t_args', 'k', '{}', NULL, TRUE, '')$$, '22023',
    'pgdq: channel must be 1 to 100 characters long, got 0', 'an empty channel name is refused'
);
SELECT throws_ok(
    $$SELECT dq_offer('t_args', 'k', '{}', NULL, TRUE, repeat('c', 101))$$, '22023',
    'pgdq: channel must be 1 to 100 characters long, got 101', 'so is one of 101 characters'
);
SELECT throws_ok(
    $$SELECT * FROM dq_offer_many('t_args', '{a,b}', '{1,2}', NULL, TRUE, '{x}')$$, '22023',
    'pgdq: channels and priorities must have as many elements as keys (2), got 1 and NULL',
    'channels of another length than keys are refused'
);
SELECT throws_ok(
    $$SELECT * FROM dq_offer_many('t_args', '{a,b}', '{1,2}', NULL, TRUE, NULL, '{1,2,3}')$$, '22023',
    'pgdq: channels and priorities must have as many elements as keys (2), got NULL and 3',
    'so are priorities'
);
SELECT throws_ok(
    $$SELECT * FROM dq_offer_many('t_args', '{a,b}', '{1,2}', NULL, TRUE, ARRAY['x', ''])$$, '22023',
    'pgdq: channels[2] must be 1 to 100 characters long, got 0', 'a bad channel element is named'
);
SELECT is((
    SELECT count(*)::int FROM dq_messages
    WHERE queue = 't_args'
), 0, 'and nothing was written');
SELECT throws_ok(
    $$SELECT dq_channel_set('t_args', NULL, 1)$$, '22004', 'pgdq: channel must not be NULL',
    'dq_channel_set needs a channel'
);
SELECT throws_ok(
    $$SELECT dq_channel_set('t_args', 'c', 0)$$, '22023',
    'pgdq: max_concurrency must be at least 1 or NULL, got 0', 'max_concurrency 0 is refused'
);
SELECT throws_ok(
    $$SELECT dq_channel_set('t_args', 'c', NULL, '-1 second')$$, '22023',
    'pgdq: min_interval must not be negative, got -00:00:01', 'a negative min_interval is refused'
);
SELECT throws_ok(
    $$SELECT dq_channel_remove('t_args', NULL)$$, '22004', 'pgdq: channel must not be NULL',
    'dq_channel_remove needs a channel'
);
SELECT is((
    SELECT count(*)::int FROM dq_groups
    WHERE queue = 't_args'
), 0, 'no channel was written');

-- offers: channel and priority are part of the message
SELECT is(dq_offer('t_out', 'k', '1', '2024-01-01 11:00:00+00', TRUE, 'c'), 'created', 'created in a channel');
SELECT is(dq_offer('t_out', 'k', '1', '2024-01-01 11:00:00+00', TRUE, 'c'), 'ignored', 'the same offer is ignored');
SELECT is(dq_offer('t_out', 'k', '1', '2024-01-01 11:00:00+00', TRUE, 'd'), 'updated', 'another channel updates');
SELECT is(dq_offer('t_out', 'k', '1', '2024-01-01 11:00:00+00', TRUE, 'd', 3), 'updated', 'another priority updates');
SELECT is(dq_offer('t_out', 'k', '1', NULL, TRUE, 'd', 3), 'ignored', 'a NULL time matches any');
SELECT is(dq_offer('t_out', 'k', '1', NULL, TRUE, NULL, NULL), 'updated', 'no channel updates again');
SELECT is(dq_offer('t_out', 'k', '1', NULL, TRUE, NULL, 0), 'ignored', 'a NULL priority is 0');
SELECT results_eq(
    $$SELECT channel, priority FROM dq_get('t_out', 'k')$$,
    $$VALUES (NULL::text, 0)$$,
    'dq_get shows no channel and priority 0'
);
SELECT results_eq(
    $$SELECT key, outcome FROM dq_offer_many('t_out', '{m,m,m}', '{1,1,1}', NULL, TRUE, '{a,a,b}', '{0,1,1}')$$,
    $$VALUES ('m', 'created'), ('m', 'updated'), ('m', 'updated')$$,
    'a batch replays channel and priority changes key by key'
);
SELECT results_eq(
    $$SELECT channel, priority FROM dq_get('t_out', 'm')$$, $$VALUES ('b'::text, 1)$$, 'the last one stays'
);

-- the turn rule: groups never leased from go by their next message's due
-- time, then the unchanneled group, then by name
SELECT pg_temp.offer('t_turn', 'a1 a2 a3', 'A', '2024-01-01 11:00:00+00');
SELECT pg_temp.offer('t_turn', 'b1', 'B', '2024-01-01 10:00:00+00');
SELECT pg_temp.offer('t_turn', 'c1 c2', 'C', '2024-01-01 11:00:00+00');
SELECT pg_temp.offer('t_turn', 'u1 u2', NULL, '2024-01-01 11:00:00+00');
SELECT pg_temp.offer('t_turn', 'later', 'D', '2024-01-01 13:00:00+00');
SELECT is(
    pg_temp.taken('t_turn', 20), 'b1 u1 a1 c1 u2 a2 c2 a3',
    'one poll: each group in turn (earliest due first, then unchanneled, then by name), then round again'
);
SELECT pg_temp.offer('t_turn', 'c3', 'C', '2024-01-01 11:00:00+00');
SELECT pg_temp.offer('t_turn', 'a4', 'A', '2024-01-01 11:00:00+00');
SELECT pg_temp.offer('t_turn', 'b2', 'B', '2024-01-01 11:00:00+00');
SELECT is(
    pg_temp.taken('t_turn', 1) || ' ' || pg_temp.taken('t_turn', 1) || ' ' || pg_temp.taken('t_turn', 1),
    'b2 c3 a4', 'across polls: the group leased from longest ago first'
);
SELECT is(pg_temp.taken('t_turn', 5), '', 'messages not yet due are not taken');

-- a channel with a million due messages cannot hold back the others
SELECT pg_temp.offer(
    't_fair', string_agg('big' || g, ' '), 'big', '2024-01-01 09:00:00+00'
) FROM generate_series(1, 500) AS g;
SELECT pg_temp.offer('t_fair', 's1 s2', 'small', '2024-01-01 11:59:00+00');
SELECT is(pg_temp.taken('t_fair', 2), 'big1 s1', 'the small channel gets the second message');
SELECT is(pg_temp.taken('t_fair', 2), 'big10 s2', 'and every other one (ties by id: key order here)');

-- priority within a group: highest first, then due time, then id
SELECT pg_temp.offer('t_prio', 'low', 'c', '2024-01-01 10:00:00+00', -1);
SELECT pg_temp.offer('t_prio', 'mid1', 'c', '2024-01-01 11:00:00+00', 0);
SELECT pg_temp.offer('t_prio', 'mid0', 'c', '2024-01-01 10:30:00+00', 0);
SELECT pg_temp.offer('t_prio', 'high', 'c', '2024-01-01 11:30:00+00', 5);
SELECT pg_temp.offer('t_prio', 'future', 'c', '2024-01-01 13:00:00+00', 9);
SELECT is(pg_temp.taken('t_prio', 10), 'high mid0 mid1 low', 'priority, then due time; future ones wait');
SELECT pg_temp.offer('t_prio_u', 'p0 q0', NULL, '2024-01-01 10:00:00+00', 0);
SELECT pg_temp.offer('t_prio_u', 'p2', NULL, '2024-01-01 11:00:00+00', 2);
SELECT pg_temp.offer('t_prio_u', 'n1', NULL, '2024-01-01 09:00:00+00', -1);
SELECT is(pg_temp.taken('t_prio_u', 10), 'p2 p0 q0 n1', 'in the unchanneled group too (ties by id)');

-- max_concurrency: counted with this call's leases; an expired lease, an
-- ack, a nack, a cancel and an update each give a slot back
SELECT dq_channel_set('t_conc', 'two', 2);
SELECT pg_temp.offer('t_conc', 'k1 k2 k3 k4 k5 k6 k7', 'two', '2024-01-01 11:00:00+00');
SELECT is(pg_temp.taken('t_conc', 10, '10 minutes'), 'k1 k2', 'one poll leases no more than max_concurrency');
SELECT is(pg_temp.taken('t_conc', 10), '', 'nor does the next');
SELECT is(dq_next_due('t_conc'), '2024-01-01 12:10:00+00', 'dq_next_due: when the first lease ends');
SELECT set_config('dq.now', '2024-01-01 12:10:00+00', TRUE);
SELECT is(
    pg_temp.taken('t_conc', 10, '10 minutes'), 'k3 k4',
    'expired leases hold no slot (and are due again behind the others)'
);
SELECT is(dq_ack((
    SELECT lock_token FROM dq_messages
    WHERE queue = 't_conc' AND key = 'k3'
)), TRUE, 'ack k3');
SELECT is(pg_temp.taken('t_conc', 10, '10 minutes'), 'k5', 'an ack frees a slot');
SELECT is(
    dq_nack((
        SELECT lock_token FROM dq_messages
        WHERE queue = 't_conc' AND key = 'k4'
    ), '2024-01-01 14:00:00+00'),
    TRUE, 'nack k4 to later'
);
SELECT is(pg_temp.taken('t_conc', 10, '10 minutes'), 'k6', 'a nack frees a slot');
SELECT is(dq_cancel('t_conc', 'k5'), TRUE, 'cancel k5');
SELECT is(pg_temp.taken('t_conc', 10, '10 minutes'), 'k7', 'a cancel frees a slot');
SELECT is(dq_offer('t_conc', 'k6', '"new"', '2024-01-01 15:00:00+00', TRUE, 'two'), 'updated', 'update k6');
SELECT is(pg_temp.taken('t_conc', 10, '10 minutes'), 'k1', 'an update frees a slot');
SELECT is(
    (
        SELECT count(*)::int FROM dq_messages
        WHERE queue = 't_conc' AND lock_token IS NOT NULL AND due_at > dq_now()
    ),
    2, 'two valid leases'
);

-- extend: a lease that ended comes back only into a free slot
SELECT set_config('dq.now', '2024-01-01 12:25:00+00', TRUE);  -- k7's and k1's leases ended
CREATE TEMP TABLE old_tokens AS
SELECT
    key,
    lock_token
FROM dq_messages
WHERE queue = 't_conc' AND key IN ('k1', 'k7');
SELECT is(pg_temp.taken('t_conc', 10, '10 minutes'), 'k2 k1', 'the slots are taken again');
SELECT is(
    dq_extend((
        SELECT lock_token FROM old_tokens
        WHERE key = 'k1'
    ), '1 minute'), NULL,
    'a token of an earlier delivery is stale'
);
SELECT is(
    dq_extend((
        SELECT lock_token FROM old_tokens
        WHERE key = 'k7'
    ), '1 minute'), NULL,
    'an ended lease does not come back while the slots are full'
);
SELECT is(dq_cancel('t_conc', 'k2'), TRUE, 'cancel k2');
SELECT is(
    dq_extend((
        SELECT lock_token FROM old_tokens
        WHERE key = 'k7'
    ), '1 minute'),
    '2024-01-01 12:26:00+00'::timestamptz,
    'but does into a free slot'
);

-- an ordered group: max_concurrency 1 delivers one at a time, in order
SELECT dq_channel_set('t_ordered', 'order-42', 1);
SELECT pg_temp.offer('t_ordered', 'created', 'order-42', '2024-01-01 12:00:00+00');
SELECT pg_temp.offer('t_ordered', 'paid', 'order-42', '2024-01-01 12:00:01+00');
SELECT pg_temp.offer('t_ordered', 'shipped', 'order-42', '2024-01-01 12:00:02+00');
SELECT set_config('dq.now', '2024-01-01 13:00:00+00', TRUE);
SELECT is(pg_temp.taken('t_ordered', 3), 'created', 'an ordered group gives one message');
SELECT is(pg_temp.taken('t_ordered', 3), '', 'and no other while it is leased');
SELECT dq_ack(lock_token) FROM dq_messages
WHERE queue = 't_ordered' AND key = 'created';
SELECT is(pg_temp.taken('t_ordered', 3), 'paid', 'the next one after the ack');

-- min_interval: one lease per call, the next one the interval later
SELECT set_config('dq.now', '2024-01-01 12:00:00+00', TRUE);
SELECT dq_channel_set('t_rate', 'partner', NULL, '1 second');
SELECT pg_temp.offer('t_rate', 'r1 r2 r3', 'partner', '2024-01-01 11:00:00+00');
SELECT pg_temp.offer('t_rate', 'free1 free2', 'other', '2024-01-01 11:00:00+00');
SELECT is(
    pg_temp.taken('t_rate', 10), 'free1 r1 free2',
    'one message of a min_interval channel per call (ties by name: other, partner)'
);
SELECT is(dq_next_due('t_rate'), '2024-01-01 12:00:01+00', 'dq_next_due: when the interval ends');
SELECT is(pg_temp.taken('t_rate', 10), '', 'none before the interval ends');
SELECT set_config('dq.now', '2024-01-01 12:00:00.999+00', TRUE);
SELECT is(pg_temp.taken('t_rate', 10), '', 'not even a millisecond before');
SELECT set_config('dq.now', '2024-01-01 12:00:01+00', TRUE);
SELECT is(pg_temp.taken('t_rate', 10), 'r2', 'the next one at the interval');

-- dq_channels and dq_stats
SELECT results_eq(
    $$SELECT * FROM dq_channels('t_rate')$$,
    $$VALUES
        ('other'::text, NULL::integer, NULL::interval, 0::bigint, 0::bigint, 2::bigint,
         '2024-01-01 12:00:00+00'::timestamptz),
        ('partner', NULL, '00:00:01', 1, 0, 2, '2024-01-01 12:00:01+00')$$,
    'dq_channels: limits, ready, delayed, leased, last lease, by name'
);
SELECT dq_channel_set('t_rate', 'idle', 3);
SELECT is(
    (SELECT array_agg(channel ORDER BY channel) FROM dq_channels('t_rate')), '{idle,other,partner}',
    'a channel with limits and no messages is listed'
);
SELECT results_eq(
    $$SELECT ready, delayed, leased FROM dq_stats('t_rate')$$,
    $$VALUES (1::bigint, 0::bigint, 4::bigint)$$,
    'dq_stats counts a message held back by its channel as ready'
);

-- removing a channel's limits
SELECT is(dq_channel_remove('t_rate', 'partner'), TRUE, 'dq_channel_remove: true when it had limits');
SELECT is(dq_channel_remove('t_rate', 'partner'), FALSE, 'false the second time');
SELECT is(dq_channel_remove('t_rate', 'idle'), TRUE, 'a channel without messages');
SELECT is(
    (SELECT array_agg(channel ORDER BY channel) FROM dq_channels('t_rate')), '{other,partner}',
    'is no longer listed'
);
SELECT is(pg_temp.taken('t_rate', 10), 'r3', 'the partner channel has no interval any more');

-- dq_next_due: the earliest time any group could have an eligible message
SELECT set_config('dq.now', '2024-01-01 12:00:00+00', TRUE);
SELECT dq_channel_set('t_next', 'slow', NULL, '1 hour');
SELECT pg_temp.offer('t_next', 's1 s2', 'slow', '2024-01-01 11:00:00+00');
SELECT pg_temp.offer('t_next', 'f1', 'fast', '2024-01-01 12:30:00+00');
SELECT is(pg_temp.taken('t_next', 10), 's1', 'one of the slow channel');
SELECT is(dq_next_due('t_next'), '2024-01-01 12:30:00+00', 'dq_next_due: the fast channel''s message');
SELECT dq_cancel('t_next', 'f1');
SELECT is(
    dq_next_due('t_next'), '2024-01-01 13:00:00+00',
    'then the slow channel''s interval (s2 is due, s1''s lease ends at 12:01)'
);
SELECT dq_channel_set('t_next', 'slow', 1);
SELECT is(dq_next_due('t_next'), '2024-01-01 12:01:00+00', 'with max_concurrency 1 instead: the end of s1''s lease');
SELECT dq_ack(lock_token) FROM dq_messages
WHERE queue = 't_next' AND key = 's1';
SELECT is(dq_next_due('t_next'), '2024-01-01 11:00:00+00', 'after its ack: s2''s due time');

-- dead letters keep channel and priority, and a redrive restores them
SELECT dq_configure('t_dead', 1);
SELECT pg_temp.offer('t_dead', 'd1', 'c', '2024-01-01 11:00:00+00', 7);
SELECT is(pg_temp.taken('t_dead', 1), 'd1', 'leased once');
SELECT set_config('dq.now', '2024-01-01 12:05:00+00', TRUE);
SELECT is(pg_temp.taken('t_dead', 1), '', 'its lease expired: buried, not delivered');
SELECT is(dq_dead_redrive('t_dead'), 1, 'redriven');
SELECT results_eq(
    $$SELECT channel, priority FROM dq_get('t_dead', 'd1')$$, $$VALUES ('c'::text, 7)$$,
    'back in its channel with its priority'
);

-- a plain queue never gets a group; a group without messages or limits is forgotten
SELECT dq_offer('t_plain', 'p', '{}');
SELECT is(pg_temp.taken('t_plain', 1), 'p', 'a plain queue is polled');
SELECT is((
    SELECT count(*)::int FROM dq_groups
    WHERE queue = 't_plain'
), 0, 'without any group');
SELECT is(
    (
        SELECT array_agg(channel ORDER BY channel) FROM dq_groups
        WHERE queue = 't_turn'
    ),
    '{"",A,B,C,D}', 't_turn has its groups'
);
SELECT set_config('dq.now', '2024-01-01 14:00:00+00', TRUE);
SELECT dq_ack(d.lock_token) FROM dq_poll_many('t_turn', 100) AS d;
SELECT is(pg_temp.taken('t_turn', 100), '', 't_turn is drained');
SELECT is(
    (
        SELECT array_agg(channel ORDER BY channel) FROM dq_groups
        WHERE queue = 't_turn'
    ),
    '{""}', 'its empty channels are forgotten by the poll that found them empty'
);

-- No JIT: generic plans of the grouped statements look costly enough at a
-- million messages that JIT compiled them on every poll (0.3-0.5 s each).
SELECT is(
    array(
        SELECT p.proname::text
        FROM pg_proc AS p
        INNER JOIN pg_extension AS e ON p.pronamespace = e.extnamespace
        INNER JOIN pg_language AS l ON p.prolang = l.oid
        WHERE
            e.extname = 'pgdq' AND l.lanname = 'plpgsql' AND 'jit=off' = any(p.proconfig)
            AND p.proname IN (
                'dq__heads', 'dq__group_first', 'dq__group_first_due', 'dq__group_next_eligible',
                'dq__group_rest', 'dq__groups_touch', 'dq__poll_grouped', 'dq__grouped_next_due',
                'dq__wake_if_first'
            )
        ORDER BY 1
    ),
    '{dq__group_first,dq__group_first_due,dq__group_next_eligible,dq__group_rest,dq__grouped_next_due,'
    'dq__groups_touch,dq__heads,dq__poll_grouped,dq__wake_if_first}'::text[],
    'the channel code runs without JIT'
);

SELECT * FROM finish();
ROLLBACK;
