-- Time-ordered delivery ids (UUIDv7), so listing deliveries by id is listing them by creation
-- and a keyset page never misses a delivery created while paging.

CREATE FUNCTION skiplock.uuid7() RETURNS uuid
LANGUAGE sql VOLATILE AS $$
    -- 48 bits of Unix milliseconds over a random (v4) UUID, then the version nibble 4 -> 7
    SELECT encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid
$$;

ALTER TABLE skiplock.webhook_deliveries ALTER COLUMN id SET DEFAULT skiplock.uuid7();
