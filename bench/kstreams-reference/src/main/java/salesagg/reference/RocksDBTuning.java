package salesagg.reference;

import java.util.Map;
import org.apache.kafka.streams.state.RocksDBConfigSetter;
import org.rocksdb.BlockBasedTableConfig;
import org.rocksdb.BloomFilter;
import org.rocksdb.Cache;
import org.rocksdb.CompressionType;
import org.rocksdb.LRUCache;
import org.rocksdb.Options;

/**
 * The RocksDB tuning a Kafka Streams user would pick for a write-heavy key-value store with
 * millions of keys ({@code --rocksdb tuned}): one block cache shared by every store of the
 * instance instead of Kafka Streams' 50 MiB per store, larger memtables (fewer, bigger flushes
 * and less compaction), 16 KiB blocks with index and filter blocks in the cache, LZ4 and two
 * background jobs (the machine's cores). Sizes come from the Streams properties
 * {@code salesagg.rocksdb.block.cache.bytes} (default 128 MiB) and
 * {@code salesagg.rocksdb.write.buffer.bytes} (default 32 MiB, 3 per store).
 */
public final class RocksDBTuning implements RocksDBConfigSetter {
    static final String BLOCK_CACHE_BYTES = "salesagg.rocksdb.block.cache.bytes";
    static final String WRITE_BUFFER_BYTES = "salesagg.rocksdb.write.buffer.bytes";
    static final long DEFAULT_BLOCK_CACHE_BYTES = 128L << 20;
    static final long DEFAULT_WRITE_BUFFER_BYTES = 32L << 20;

    private static Cache cache; // shared by every store of this JVM, never closed

    private BloomFilter filter;

    private static synchronized Cache sharedCache(long bytes) {
        if (cache == null) {
            cache = new LRUCache(bytes);
        }
        return cache;
    }

    private static long size(Map<String, Object> configs, String key, long dflt) {
        Object v = configs.get(key);
        return v == null ? dflt : Long.parseLong(v.toString().trim());
    }

    @Override
    public void setConfig(String storeName, Options options, Map<String, Object> configs) {
        BlockBasedTableConfig table = (BlockBasedTableConfig) options.tableFormatConfig();
        table.setBlockCache(sharedCache(size(configs, BLOCK_CACHE_BYTES, DEFAULT_BLOCK_CACHE_BYTES)));
        table.setBlockSize(16 * 1024L);
        table.setCacheIndexAndFilterBlocks(true);
        table.setPinL0FilterAndIndexBlocksInCache(true);
        filter = new BloomFilter(10, false);
        table.setFilterPolicy(filter);
        options.setTableFormatConfig(table);
        options.setWriteBufferSize(size(configs, WRITE_BUFFER_BYTES, DEFAULT_WRITE_BUFFER_BYTES));
        options.setMaxWriteBufferNumber(3);
        options.setCompressionType(CompressionType.LZ4_COMPRESSION);
        options.setMaxBackgroundJobs(2);
    }

    @Override
    public void close(String storeName, Options options) {
        if (filter != null) {
            filter.close();
        }
    }
}
