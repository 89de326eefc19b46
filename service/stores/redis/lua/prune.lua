-- Settling alone (no new ids): the expired leave the tenant's count.
return 0
