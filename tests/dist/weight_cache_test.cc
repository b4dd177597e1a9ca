// WeightCache (dist/weight_cache.h): SHA-256 against published test vectors, entries stored and
// read back verified, corrupted, truncated and lengthened entries detected and dropped, bytes
// that do not match their key refused without storing anything, streamed writes, leftovers of a
// dead writer, and threads writing and reading the same entries at once.
#include "folio/dist/weight_cache.h"

#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "testing/collective_groups.h"

namespace folio::dist {
namespace {

using ::testing::HasSubstr;

std::span<const std::byte> bytes_of(const std::string& text) {
  return std::as_bytes(std::span(text.data(), text.size()));
}

std::vector<std::byte> pattern_bytes(size_t size, uint32_t seed) {
  std::vector<std::byte> bytes(size);
  uint32_t state = seed * 2654435761u + 1;
  for (std::byte& byte : bytes) {
    state = state * 1664525u + 1013904223u;
    byte = static_cast<std::byte>(state >> 24);
  }
  return bytes;
}

std::unique_ptr<WeightCache> open_cache(const std::string& directory) {
  Result<std::unique_ptr<WeightCache>> cache = WeightCache::open(directory);
  FOLIO_CHECK(cache.ok(), "{}", cache.status().to_string());
  return std::move(cache).value();
}

size_t count_files(const std::string& directory) {
  size_t count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    if (entry.is_regular_file()) ++count;
  }
  return count;
}

// FIPS 180-2's examples (also RFC 6234's test vectors).
TEST(ContentHashTest, MatchesPublishedSha256Vectors) {
  EXPECT_EQ(ContentHash::of(bytes_of("abc")).to_string(),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(ContentHash::of(bytes_of("")).to_string(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  ContentHasher hasher;  // the same bytes in pieces
  hasher.update(bytes_of("abcdbcdecdefdefgefghfghighij"));
  hasher.update(bytes_of("hijkijkljklmklmnlmnomnopnopq"));
  EXPECT_EQ(hasher.finish().to_string(),
            "sha256:248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(ContentHashTest, ParsesWhatItPrintsAndRefusesOtherText) {
  const ContentHash hash = ContentHash::of(bytes_of("weights"));
  Result<ContentHash> parsed = ContentHash::parse(hash.to_string());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, hash);
  for (const std::string& text :
       {std::string("sha256:abc"), std::string("md5:") + std::string(64, '0'),
        std::string("sha256:") + std::string(63, '0') + "g", std::string()}) {
    Result<ContentHash> refused = ContentHash::parse(text);
    ASSERT_FALSE(refused.ok()) << text;
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  }
}

TEST(WeightCacheTest, StoredEntryReadsBackVerified) {
  folio::testing::TemporaryDirectory directory;
  auto cache = open_cache(directory.path() + "/cache");
  const std::vector<std::byte> bytes = pattern_bytes(10000, 1);
  const ContentHash hash = ContentHash::of(bytes);
  EXPECT_FALSE(cache->contains(hash));
  EXPECT_EQ(cache->verify(hash).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(cache->put(hash, bytes).ok());
  EXPECT_TRUE(cache->contains(hash));
  Result<int64_t> size = cache->verify(hash);
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(*size, 10000);
  std::vector<std::byte> read(bytes.size());
  ASSERT_TRUE(cache->read(hash, read).ok());
  EXPECT_EQ(read, bytes);
  // Another cache object over the same directory (a restarted worker) finds it.
  auto again = open_cache(directory.path() + "/cache");
  EXPECT_TRUE(again->verify(hash).ok());
}

TEST(WeightCacheTest, CorruptedEntryIsDetectedAndDropped) {
  folio::testing::TemporaryDirectory directory;
  auto cache = open_cache(directory.path());
  const std::vector<std::byte> bytes = pattern_bytes(5000, 2);
  const ContentHash hash = ContentHash::of(bytes);
  ASSERT_TRUE(cache->put(hash, bytes).ok());
  {
    std::fstream file(cache->entry_path(hash), std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(1234);
    const char flipped = static_cast<char>(std::to_integer<uint8_t>(bytes[1234]) ^ 0x01);
    file.write(&flipped, 1);
  }
  Result<int64_t> verified = cache->verify(hash);
  ASSERT_FALSE(verified.ok());
  EXPECT_EQ(verified.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(verified.status().message(), HasSubstr("corrupted"));
  EXPECT_THAT(verified.status().message(), HasSubstr("fetched again"));
  EXPECT_FALSE(cache->contains(hash)) << "a corrupted entry is deleted";

  // read() detects it too: a flipped byte, a truncated file, a longer one.
  for (int variant = 0; variant < 3; ++variant) {
    ASSERT_TRUE(cache->put(hash, bytes).ok());
    const std::string path = cache->entry_path(hash);
    if (variant == 0) {
      std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
      file.seekp(0);
      const char flipped = static_cast<char>(std::to_integer<uint8_t>(bytes[0]) ^ 0x80);
      file.write(&flipped, 1);
    } else if (variant == 1) {
      std::filesystem::resize_file(path, bytes.size() - 1);
    } else {
      std::ofstream(path, std::ios::app | std::ios::binary).put('x');
    }
    std::vector<std::byte> read(bytes.size());
    const Status status = cache->read(hash, read);
    EXPECT_EQ(status.code(), StatusCode::kDataLoss) << "variant " << variant << ": " << status;
    EXPECT_FALSE(cache->contains(hash)) << "variant " << variant;
  }
}

TEST(WeightCacheTest, BytesThatDoNotMatchTheirKeyAreRefusedAndNothingIsStored) {
  folio::testing::TemporaryDirectory directory;
  auto cache = open_cache(directory.path());
  const std::vector<std::byte> bytes = pattern_bytes(3000, 3);
  const ContentHash other = ContentHash::of(pattern_bytes(3000, 4));
  const Status status = cache->put(other, bytes);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(ContentHash::of(bytes).to_string()));
  EXPECT_FALSE(cache->contains(other));
  EXPECT_EQ(count_files(directory.path()), 0u);
  EXPECT_EQ(count_files(directory.path() + "/tmp"), 0u) << "no temporary file left";
}

TEST(WeightCacheTest, StreamedWriterChecksSizeAndHash) {
  folio::testing::TemporaryDirectory directory;
  auto cache = open_cache(directory.path());
  const std::vector<std::byte> bytes = pattern_bytes(4096, 5);
  const ContentHash hash = ContentHash::of(bytes);
  {
    Result<std::unique_ptr<WeightCache::Writer>> writer = cache->begin(hash, 4096);
    ASSERT_TRUE(writer.ok());
    for (size_t offset = 0; offset < bytes.size(); offset += 1000) {
      const size_t size = std::min<size_t>(1000, bytes.size() - offset);
      ASSERT_TRUE((*writer)->append(std::span(bytes).subspan(offset, size)).ok());
      EXPECT_FALSE(cache->contains(hash)) << "not visible before commit";
    }
    ASSERT_TRUE((*writer)->commit().ok());
  }
  EXPECT_TRUE(cache->verify(hash).ok());
  cache->remove(hash);
  {  // More bytes than announced.
    Result<std::unique_ptr<WeightCache::Writer>> writer = cache->begin(hash, 100);
    ASSERT_TRUE(writer.ok());
    EXPECT_EQ((*writer)->append(bytes).code(), StatusCode::kInvalidArgument);
  }
  {  // Fewer.
    Result<std::unique_ptr<WeightCache::Writer>> writer = cache->begin(hash, 4096);
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE((*writer)->append(std::span(bytes).first(4000)).ok());
    EXPECT_EQ((*writer)->commit().code(), StatusCode::kInvalidArgument);
  }
  {  // Abandoned half way (a stream that broke).
    Result<std::unique_ptr<WeightCache::Writer>> writer = cache->begin(hash, 4096);
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE((*writer)->append(std::span(bytes).first(10)).ok());
  }
  EXPECT_FALSE(cache->contains(hash));
  EXPECT_EQ(count_files(directory.path() + "/tmp"), 0u);
}

TEST(WeightCacheTest, OpenRemovesLeftoversAndReportsAnUnusableDirectory) {
  folio::testing::TemporaryDirectory directory;
  { auto cache = open_cache(directory.path()); }
  std::ofstream(directory.path() + "/tmp/dead-writer.part") << "partial";
  auto cache = open_cache(directory.path());
  EXPECT_EQ(count_files(directory.path() + "/tmp"), 0u);

  const std::string file = directory.path() + "/not-a-directory";
  std::ofstream(file) << "x";
  Result<std::unique_ptr<WeightCache>> refused = WeightCache::open(file + "/cache");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(refused.status().message(), HasSubstr("--cache-dir"));
  EXPECT_EQ(WeightCache::open("").status().code(), StatusCode::kInvalidArgument);
}

// Four threads (two cache objects, as two processes would hold) write and read the same few
// entries at once: every read that succeeds has the right bytes, and each entry ends sound.
TEST(WeightCacheTest, ConcurrentWritersAndReadersOfTheSameEntries) {
  folio::testing::TemporaryDirectory directory;
  auto first = open_cache(directory.path());
  auto second = open_cache(directory.path());
  std::vector<std::vector<std::byte>> entries;
  std::vector<ContentHash> hashes;
  for (uint32_t i = 0; i < 4; ++i) {
    entries.push_back(pattern_bytes(20000 + 1000 * i, 10 + i));
    hashes.push_back(ContentHash::of(entries.back()));
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const WeightCache& cache = t % 2 == 0 ? *first : *second;
      for (int round = 0; round < 50; ++round) {
        const size_t i = static_cast<size_t>(round + t) % entries.size();
        if ((round + t) % 3 == 0) {
          if (!cache.put(hashes[i], entries[i]).ok()) ++failures;
        } else {
          std::vector<std::byte> read(entries[i].size());
          const Status status = cache.read(hashes[i], read);
          if (status.ok() && read != entries[i]) ++failures;
          if (!status.ok() && status.code() != StatusCode::kNotFound) ++failures;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  for (size_t i = 0; i < entries.size(); ++i) {
    if (first->contains(hashes[i])) {
      EXPECT_TRUE(first->verify(hashes[i]).ok());
    }
  }
  EXPECT_EQ(count_files(directory.path() + "/tmp"), 0u);
}

}  // namespace
}  // namespace folio::dist
