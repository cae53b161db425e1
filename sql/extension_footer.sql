-- Extension only: let pg_dump keep the messages (the tables are extension-owned)
-- and the id sequence's position (restored ids must not be handed out again).
SELECT pg_catalog.pg_extension_config_dump('dq_messages', '');
SELECT pg_catalog.pg_extension_config_dump('dq_queues', '');
SELECT pg_catalog.pg_extension_config_dump('dq_dead_letters', '');
SELECT pg_catalog.pg_extension_config_dump('dq_schedules', '');
SELECT pg_catalog.pg_extension_config_dump('dq_messages_id_seq', '');
