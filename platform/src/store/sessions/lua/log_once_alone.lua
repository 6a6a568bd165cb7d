-- Logging alone answers the sequence number the message was logged under.
return seq
